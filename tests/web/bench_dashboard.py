"""How fast the dashboard draws a large pool (a measurement script, not a test).

    .venv/bin/python -m tests.web.bench_dashboard --gpus 1000 --jobs 1000

Starts a server, registers ``--gpus / 8`` fake nodes of 8 GPUs each through the agent API
(one heartbeat each, with telemetry), submits ``--jobs`` pending-or-placed jobs, then signs
in with headless chromium and prints a table (``--json`` for the same figures as JSON):

- sign-in to a complete GPU grid (wall time in the page, from the sign-in click);
- the grid's build time and its per-sample update time (user-timing measures the overview
  records: ``gpupool:grid-build``, ``gpupool:grid-update``);
- /metrics size and fetch time as the browser sees it;
- the jobs page: time until every job's row is in the table.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from tests.web.conftest import CHROMIUM_ARGS, chromium_path
from tests.web.pool import LivePool

GPUS_PER_NODE = 8


def register_fake_nodes(pool: LivePool, gpus: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    token = pool.agent_token.read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=pool.url, headers=headers, timeout=30) as http:
        for n in range(gpus // GPUS_PER_NODE):
            node = f"fake-{n:04d}"
            devices = [
                {
                    "uuid": f"GPU-fake-{n:04d}-{i}",
                    "index": i,
                    "model": "NVIDIA A100-SXM4-80GB" if n % 2 else "NVIDIA H100 80GB HBM3",
                    "memory_mib": 81920,
                    "nvlink_group": 0,
                }
                for i in range(GPUS_PER_NODE)
            ]
            body = {
                "node": node,
                "cpu_milli": 64000,
                "memory_mib": 512 * 1024,
                "devices": devices,
                "agent_version": "bench",
                "isolation_modes": ["exclusive", "soft"],
            }
            epoch = http.post("/v1/agent/register", json=body).raise_for_status().json()["epoch"]
            telemetry = [
                {
                    "uuid": d["uuid"],
                    "utilization_ratio": round(rng.random(), 3),
                    "memory_used_mib": rng.randrange(0, 81920),
                    "temperature_c": round(rng.uniform(30, 80), 1),
                    "power_w": round(rng.uniform(60, 400), 1),
                }
                for d in devices
            ]
            http.post(
                "/v1/agent/heartbeat",
                json={"node": node, "epoch": epoch, "telemetry": telemetry, "replicas": []},
            ).raise_for_status()


def measure(pool: LivePool, gpus: int, jobs: int, samples: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        raise SystemExit("chromium not found at /usr/bin/chromium: apt-get install chromium")
    out: dict[str, Any] = {"gpus": gpus, "jobs": jobs}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(120_000)
        page.goto(f"{pool.url}/")
        page.fill("#token", pool.tokens["admin"])
        page.evaluate("() => { window.__t0 = performance.now(); }")
        page.click("#signin-form button[type=submit]")
        page.wait_for_function(
            f"() => document.querySelectorAll('.gpu').length >= {gpus}"
            " && document.querySelector('.gpu-foot').textContent.includes('°C')"
        )
        out["signin_to_grid_ms"] = page.evaluate("() => performance.now() - window.__t0")
        page.wait_for_function(
            f"() => performance.getEntriesByName('gpupool:grid-update').length >= {samples}",
            timeout=samples * 5_000 + 30_000,
        )
        timing = page.evaluate(
            """() => ({
              build: performance.getEntriesByName('gpupool:grid-build').map((e) => e.duration),
              update: performance.getEntriesByName('gpupool:grid-update').map((e) => e.duration),
              metrics: performance.getEntriesByType('resource')
                .filter((e) => e.name.endsWith('/metrics'))
                .map((e) => ({ ms: e.duration, bytes: e.transferSize || e.encodedBodySize })),
              dom: document.getElementsByTagName('*').length,
            })"""
        )
        out["grid_build_ms"] = min(timing["build"])
        out["grid_update_ms_median"] = statistics.median(timing["update"])
        out["grid_update_ms_max"] = max(timing["update"])
        out["metrics_fetch_ms_median"] = statistics.median(m["ms"] for m in timing["metrics"])
        out["metrics_kib"] = max(m["bytes"] for m in timing["metrics"]) / 1024
        out["dom_elements"] = timing["dom"]
        page.evaluate("() => { window.__t1 = performance.now(); location.hash = '#/jobs'; }")
        page.wait_for_function(
            f"() => document.querySelectorAll('#jobs-body tr[data-job]').length >= {min(jobs, 200)}"
        )
        out["jobs_page_ms"] = page.evaluate("() => performance.now() - window.__t1")
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--samples", type=int, default=5, help="telemetry samples to time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # `timeout` sends SIGTERM: exit through the finally below so no server is left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory() as tmp:
        pool = LivePool(Path(tmp))
        try:
            pool.start(agent=False)
            register_fake_nodes(pool, args.gpus)
            for i in range(args.jobs):
                pool.submit("alice" if i % 2 else "bob", f"bench-{i}", gpus="0.25", seconds=60)
            figures = measure(pool, args.gpus, args.jobs, args.samples)
        finally:
            pool.close()
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"{'figure':<28} {'value':>10}")
    for key, value in figures.items():
        print(f"{key:<28} {value:>10.1f}" if isinstance(value, float) else f"{key:<28} {value:>10}")


if __name__ == "__main__":
    main()
