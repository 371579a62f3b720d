"""Cost of gpupool's CUDA shim on the fake driver: ns per intercepted call and per launch, and
how close launch pacing keeps a replica to its SM share.

Each row runs the same C program (tests/shim/csrc/bench.c) four ways: against the fake driver
alone (*no shim*), through the façade with no region (*pass-through*), with a region and no
compute cap (*slice, no cap*: memory accounting on, launches unpaced), and with a 99.9 % cap
(*paced*: every launch settles timing events and checks the bucket). The overhead is the
difference to *no shim*. Pacing fidelity runs 2 ms fake kernels back to back for --window-ms at
each share, on 1, 2, 4 and 8 streams (round robin) and as a captured CUDA graph of four 2 ms
kernels launched over and over, and reports the busy ratio from the fake driver's own record
(the device's union of kernel time over the window).

    .venv/bin/python benchmarks/bench_shim.py                  # tables
    .venv/bin/python benchmarks/bench_shim.py --fidelity-only  # the pacing table alone
    .venv/bin/python benchmarks/bench_shim.py --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import tempfile
from pathlib import Path

from gpupool.runtime.shim import DeviceSlice, Region, job_env
from gpupool.shim.build import CSRC, ensure_built

ROOT = Path(__file__).resolve().parents[1]
TEST_C = ROOT / "tests" / "shim" / "csrc"
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{CSRC}"]
FAKE_UUID = "GPU-" + "-".join(
    (b"gpupoolfakegpu\0\0".hex()[a:b]) for a, b in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32))
)


def cc(*args: str) -> None:
    subprocess.run(["cc", *CFLAGS, *args], check=True)


def run_bench(binary: Path, env: dict[str, str], n: int) -> dict[str, float]:
    out = subprocess.run([str(binary), str(n)], env=env, capture_output=True, text=True, check=True)
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in out.stdout.splitlines()
    }


def busy_ratio(log: Path) -> float:
    """The fake driver's kernel time over its window; NaN when no kernel ran (the way failed:
    a capture the shim broke, say)."""
    rec = struct.Struct("<iiQQ")
    data = log.read_bytes() if log.exists() else b""
    if not data:
        return math.nan
    rows = [rec.unpack_from(data, i * rec.size) for i in range(len(data) // rec.size)]
    busy, reach = 0, 0  # the union: concurrent streams' kernels overlap
    for _pid, _dev, s, e in sorted(rows, key=lambda r: r[2]):
        busy += max(0, e - max(s, reach))
        reach = max(reach, e)
    return busy / (reach - min(r[2] for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--window-ms", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fidelity-only", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-shim-"))
    build = ensure_built()
    (work / "fake").mkdir()
    fake = work / "fake" / "libcuda.so.1"
    cc("-fPIC", "-shared", "-fvisibility=hidden", str(TEST_C / "fake_cuda.c"), "-o", str(fake),
       "-Wl,-soname,libcuda.so.1", "-ldl", "-lpthread")  # fmt: skip
    bench = work / "bench"
    cc(str(TEST_C / "bench.c"), "-o", str(bench), "-ldl")
    probe = work / "probe"
    cc(str(TEST_C / "probe.c"), "-o", str(probe), "-ldl", "-lpthread")

    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def region(share: int, name: str) -> Region:
        slices = [DeviceSlice(uuid=FAKE_UUID, mem_limit_bytes=1 << 40, sm_share_permille=share)]
        return Region.create(work / f"{name}.region", name, slices, build=build)

    configs = {
        "no shim": {**base, "LD_LIBRARY_PATH": str(fake.parent)},
        "pass-through": {
            **base,
            "LD_LIBRARY_PATH": str(build.facade_dir),
            "GPUPOOL_REAL_LIBCUDA": str(fake),
        },
        "slice, no cap": job_env(region(1000, "nocap").path, fake, build=build, base=base),
        "paced (99.9 %)": job_env(region(999, "paced").path, fake, build=build, base=base),
    }
    costs: dict[str, dict[str, float]] = {}
    for name, env in ({} if args.fidelity_only else configs).items():
        runs = [run_bench(bench, env, args.iterations) for _ in range(args.repeat)]
        costs[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    events_per_launch = None
    if not args.fidelity_only:  # the fake counts the timing events the paced launches record
        counts = work / "counts"
        run_bench(bench, {**configs["paced (99.9 %)"], "FAKE_CUDA_COUNTS": str(counts)},
                  args.iterations)  # fmt: skip
        events_per_launch = int(counts.read_text().split()[0]) / (3 * (args.iterations // 4))

    shares = (10, 30, 50, 70, 90)
    ways = {"1 stream": "1", "2 streams": "2", "4 streams": "4", "8 streams": "8", "graphs": "g"}
    fidelity: dict[str, dict[int, float]] = {w: {} for w in ways}
    for way, how in ways.items():
        for pct in shares:
            r = region(pct * 10, f"share{pct}-{how}")
            log = work / f"share{pct}-{how}.log"
            env = {**job_env(r.path, fake, build=build, base=base), "FAKE_CUDA_LOG": str(log)}
            if how == "g":  # capture four 2 ms kernels once, launch the graph for the window
                cmds = "init\ncapturekernels 4 2000000 0\n"
                p = subprocess.Popen([str(probe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True)  # fmt: skip
                assert p.stdin is not None
                assert p.stdout is not None
                p.stdin.write(cmds)
                p.stdin.flush()
                p.stdout.readline()
                handle = p.stdout.readline().split()[1]
                p.communicate(f"glaunchfor {handle} {args.window_ms}\nexit\n", timeout=600)
            else:
                cmds = f"init\nlaunchfor 2000000 {args.window_ms} kernel {how}\nexit\n"
                subprocess.run(
                    [str(probe)], input=cmds, env=env, capture_output=True, text=True, check=True
                )
            fidelity[way][pct] = busy_ratio(log)

    if args.json:
        out = {"ns_per_call": costs, "paced_events_per_launch": events_per_launch}
        print(json.dumps({**out, "pacing_busy_ratio": fidelity}, indent=2))
        return
    if costs:
        calls = list(costs["no shim"])
        print("| call | " + " | ".join(costs) + " |")
        print("|---|" + "---|" * len(costs))
        for c in calls:
            print(f"| {c} | " + " | ".join(f"{costs[k][c]:.0f}" for k in costs) + " |")
        print(f"\ntiming events recorded per paced launch: {events_per_launch:.4f}\n")
    print("| share % | " + " | ".join(ways) + " |")
    print("|---|" + "---|" * len(ways))
    for p in shares:
        cells = (
            "failed" if math.isnan(r := fidelity[w][p]) else f"{100 * r:.1f} ({100 * r - p:+.1f})"
            for w in ways
        )
        print(f"| {p} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
