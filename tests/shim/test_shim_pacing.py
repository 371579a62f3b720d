"""Launch pacing: a replica's SM time on a device stays near its share.

The fake driver's GPU thread busy-waits each kernel's duration and logs when it ran; the busy
ratio is the logged kernel time over the window from the first kernel's start to the last one's
end, taken from the driver's own record (not from the shim). Tolerance: 4 percentage points of
the device, stated in docs/shim.md; measured on a loaded 2-core machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.runtime.shim import DeviceSlice, Region
from tests.shim.conftest import shim_env
from tests.shim.helpers import Natives, Probe, fake_uuid, kernel_records

# The busy ratios these tests read depend on the CPU the fake driver's process gets: they run
# alone, after the parallel part of the suite (`serial`, Makefile), not beside other workers.
pytestmark = pytest.mark.serial

TOLERANCE = 0.04
KERNEL_NS = 2_000_000  # 2 ms
WINDOW_MS = 3000


def busy_ratio(log: Path) -> float:
    """The device's busy time (the union of the logged kernels: concurrent streams' kernels
    overlap) over the window from the first kernel's start to the last one's end."""
    recs = kernel_records(log)
    assert len(recs) > 10, "too few kernels ran to measure"
    busy, reach = 0, 0
    for _pid, _dev, s, e in sorted(recs, key=lambda r: r[2]):
        busy += max(0, e - max(s, reach))
        reach = max(reach, e)
    return busy / (reach - min(r[2] for r in recs))


def run(natives: Natives, region: Region, log: Path, probes: list[Probe], kind: str = "kernel",
        n: int = 1, streams: int = 0, **extra: str) -> float:  # fmt: skip
    env = shim_env(natives, region, FAKE_CUDA_LOG=str(log), **extra)
    ps = [Probe(natives.probe, env) for _ in range(n)]
    probes.extend(ps)
    for p in ps:
        p.ok("init")
    for p in ps:  # all start before any is awaited
        assert p.proc.stdin is not None
        p.proc.stdin.write(f"launchfor {KERNEL_NS} {WINDOW_MS} {kind} {streams or ''}\n")
        p.proc.stdin.flush()
    for p in ps:
        assert p.proc.stdout is not None
        assert p.proc.stdout.readline().startswith("ok"), p.stderr()
    return busy_ratio(log)


@pytest.mark.parametrize("percent", [10, 30, 50, 70, 90])
def test_launches_are_paced_to_the_share(natives, make_region, probes, tmp_path, percent):
    region = make_region(share=percent * 10)
    ratio = run(natives, region, tmp_path / "k.log", probes)
    assert abs(ratio - percent / 100) <= TOLERANCE, f"busy {ratio:.3f} at a {percent} % share"
    usage = region.read().device(fake_uuid(0))
    assert usage.launches > 0


@pytest.mark.parametrize("kind", ["ex", "coop", "graph"])
def test_every_launch_kind_is_paced(natives, make_region, probes, tmp_path, kind):
    region = make_region(share=300)
    ratio = run(natives, region, tmp_path / "k.log", probes, kind)
    assert abs(ratio - 0.3) <= TOLERANCE, f"busy {ratio:.3f} for {kind} launches at 30 %"


@pytest.mark.parametrize("concurrent", [True, False], ids=["concurrent", "serial"])
@pytest.mark.parametrize("streams", [2, 4, 5, 8, 20, 40])
def test_many_streams_share_one_cap(natives, make_region, probes, tmp_path, streams, concurrent):
    """Issue 25, finding 4: the busy time of a process's streams is their union on the device
    (spans of concurrent streams counted once), and 32 streams are tracked at once (5 or more
    used to drop the cap entirely); past that the least recently used track is settled before
    it is evicted (40 streams). The fake runs the streams concurrently, as a GPU does with
    kernels that leave it room, or on one timeline."""
    region = make_region(share=300)
    extra = {"FAKE_CUDA_CONCURRENT": "1"} if concurrent else {}
    ratio = run(natives, region, tmp_path / "k.log", probes, streams=streams, **extra)
    assert abs(ratio - 0.3) <= TOLERANCE, f"busy {ratio:.3f} over {streams} streams at 30 %"


def test_an_uncapped_replica_runs_flat_out(natives, make_region, probes, tmp_path):
    region = make_region(share=1000)
    ratio = run(natives, region, tmp_path / "k.log", probes)
    assert ratio > 0.9


def test_processes_of_a_replica_share_one_compute_budget(natives, make_region, probes, tmp_path):
    region = make_region(share=400)
    # Three processes, each with its own fake GPU thread, together stay near 40 % of the device.
    log = tmp_path / "k.log"
    run(natives, region, log, probes, n=3)
    recs = kernel_records(log)
    start, end = min(r[2] for r in recs), max(r[3] for r in recs)
    ratio = sum(r[3] - r[2] for r in recs) / (end - start)
    assert abs(ratio - 0.4) <= TOLERANCE, f"busy {ratio:.3f} for three processes at 40 %"
    assert len({r[0] for r in recs}) == 3


def test_idle_time_goes_to_the_replica_only_where_lending_is_on(natives, probes, tmp_path):
    slices = [DeviceSlice(uuid=fake_uuid(0), mem_limit_bytes=1 << 30, sm_share_permille=300)]
    lent = Region.create(
        tmp_path / "lent.region", "lent", slices, lend_idle=True, build=natives.shim
    )
    capped = Region.create(tmp_path / "capped.region", "capped", slices, build=natives.shim)
    for r in (lent, capped):
        r.set_spare(fake_uuid(0), 400)  # the agent saw the device otherwise idle
    with_lending = run(natives, lent, tmp_path / "lent.log", probes)
    without = run(natives, capped, tmp_path / "capped.log", probes)
    assert abs(with_lending - 0.7) <= TOLERANCE, f"busy {with_lending:.3f} at 30 % + 40 % lent"
    assert abs(without - 0.3) <= TOLERANCE, f"busy {without:.3f} at 30 %, lending off"


def test_a_share_change_is_seen_by_a_running_process(natives, make_region, probes, tmp_path):
    region = make_region(share=200)
    log = tmp_path / "k.log"
    p = Probe(natives.probe, shim_env(natives, region, FAKE_CUDA_LOG=str(log)))
    probes.append(p)
    p.ok("init")
    p.ok(f"launchfor {KERNEL_NS} {WINDOW_MS} kernel")
    first = busy_ratio(log)
    log.write_bytes(b"")  # the driver appends: start the second window afresh
    region.set_share(fake_uuid(0), 600)
    p.ok(f"launchfor {KERNEL_NS} {WINDOW_MS} kernel")
    second = busy_ratio(log)
    assert abs(first - 0.2) <= TOLERANCE
    assert abs(second - 0.6) <= TOLERANCE


def test_a_paced_launch_records_a_timing_event_only_now_and_then(natives, make_region, probes,
                                                                 tmp_path):  # fmt: skip
    """Issue 25, finding 10: a timing event between every kernel cost 1-3 us per launch and
    blocks programmatic dependent launch; events are sampled (about one per millisecond of a
    stream's work), and the share still holds."""
    counts, log = tmp_path / "counts", tmp_path / "k.log"
    region = make_region(share=500)
    env = shim_env(natives, region, FAKE_CUDA_COUNTS=str(counts), FAKE_CUDA_LOG=str(log))
    p = Probe(natives.probe, env)
    probes.append(p)
    p.ok("init")
    p.ok(f"launchfor 100000 {WINDOW_MS} kernel")  # 100 us kernels
    p.close()
    records, launches = map(int, counts.read_text().split())
    assert launches > 1000
    assert records / launches <= 0.5, f"{records} timing events for {launches} launches"
    # The cap holds with sampled events. (100 us kernels on a loaded 2-core machine: the fake's
    # GPU thread and the probe both wake late, so the busy share can fall short of 50 %; the
    # 2 ms tests above hold the ±4 points both ways.)
    ratio = busy_ratio(log)
    assert 0.25 <= ratio <= 0.5 + TOLERANCE, f"busy {ratio:.3f} for sampled 100 us kernels at 50 %"
