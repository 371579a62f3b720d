"""Container start against a bare process: from the start order to RUNNING, and to the job's
first action.

A real ``gpupool server`` and one ``gpupool agent`` (one simulated A100, heartbeat 0.5 s), and
``--n`` jobs of each kind run one after the other, alternating: the same shell line
(``echo go > OUT/NAME.mark``), bare and in a busybox image imported into podman (as the tests
make it). Per job, from the **start order** (its CONFIGURING event on the server: the
assignment the agent is told to start) to

- **RUNNING**: the supervisor recorded the program started (``started_at`` in the replica's
  ``state.json``); for a container that is after the image check and ``podman create``, when
  ``podman start --attach`` is spawned;
- **first action**: the job's shell line wrote its mark file (the file's modification time):
  inside the container, after runc started it.

Needs root, podman, runc and busybox-static (``.ci/services.sh``). Prints one JSON object and a
Markdown table of the medians.

    .venv/bin/python benchmarks/bench_container_start.py [--n 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.containers.conftest import build_rootfs, import_image  # noqa: E402
from tests.e2e.pool import Pool, wait_for  # noqa: E402

from gpupool.containers.engines import CONTAINERS_CONF  # noqa: E402


def run_one(pool: Pool, name: str, image: str | None) -> dict[str, float]:
    mark = pool.out / f"{name}.mark"
    spec: dict[str, object] = {"name": name, "script": f"echo go > {mark}"}
    if image is not None:
        spec["container"] = {"image": image, "mounts": [f"{pool.out}:{pool.out}"]}
    job_id = pool.post("/v1/jobs", {"spec": spec})["job"]["id"]
    pool.wait_state(job_id, "COMPLETED", "FAILED", "BOOT_FAIL", timeout=120)
    events = pool.get(f"/v1/jobs/{job_id}/events")
    ordered = next(e["time"] for e in events if e["target"] == "CONFIGURING")
    done = pool.state_dir("n1") / "done"
    state = wait_for(
        lambda: next(
            (
                json.loads(p.read_text())
                for p in done.glob("*/state.json")
                if json.loads((p.parent / "assignment.json").read_text())["assignment"]["job_id"]
                == job_id
            ),
            None,
        ),
        60,
        f"{name}'s record",
    )
    return {
        "running_ms": (state["started_at"] - ordered) * 1000,
        "first_action_ms": (mark.stat().st_mtime - ordered) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5, help="jobs of each kind")
    args = parser.parse_args()
    if args.n < 1:
        parser.error("--n must be 1 or more")
    root = Path(tempfile.mkdtemp(prefix="gpupool-bench-containers-"))
    conf = root / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    image = import_image(env, "gpupool-test-busybox", build_rootfs(), root)
    pool = Pool(root / "pool")
    load_before = os.getloadavg()[0]
    results: dict[str, list[dict[str, float]]] = {"bare": [], "container": []}
    try:
        pool.start_server()
        pool.start_agent("n1", "1xA100-80GB")
        run_one(pool, "warmup", image)  # the first podman call of a fresh agent pays more
        for i in range(args.n):
            results["bare"].append(run_one(pool, f"bare{i}", None))
            results["container"].append(run_one(pool, f"container{i}", image))
            time.sleep(0.2)
    finally:
        pool.close()
    summary = {
        kind: {
            key: round(statistics.median(r[key] for r in runs), 1)
            for key in ("running_ms", "first_action_ms")
        }
        for kind, runs in results.items()
    }
    print(
        json.dumps(
            {
                "n": args.n,
                "load1_before": round(load_before, 2),
                "load1_after": round(os.getloadavg()[0], 2),
                "median": summary,
                "runs": results,
            },
            indent=1,
        )
    )
    print("\n| kind | start order -> RUNNING (ms) | start order -> first action (ms) |")
    print("|---|---|---|")
    for kind, row in summary.items():
        print(f"| {kind} | {row['running_ms']} | {row['first_action_ms']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
