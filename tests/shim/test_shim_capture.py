"""Stream capture under a compute cap (issue 25, finding 1).

PyTorch and vLLM capture CUDA graphs: while a stream captures, its launches become graph nodes,
and the driver forbids querying or synchronising events (in any thread under a GLOBAL-mode
capture, in the capturing thread under THREAD_LOCAL); a forbidden call invalidates the capture.
The fake driver enforces that and writes each refused call to ``FAKE_CUDA_CAPTURE_LOG``. The
shim's pacing must keep out of a capture entirely, and pace the captured graph when it is
launched, as one span.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shim.conftest import shim_env
from tests.shim.helpers import Probe
from tests.shim.test_shim_pacing import TOLERANCE, busy_ratio

KERNEL_NS = 2_000_000
MODES = {"global": 0, "thread_local": 1, "relaxed": 2}


@pytest.mark.parametrize("flavour", ["default", "ptsz"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_capture_under_a_cap_touches_no_event(natives, make_region, probes, tmp_path, mode,
                                                flavour):  # fmt: skip
    refused = tmp_path / "capture.log"
    region = make_region(share=300)
    env = shim_env(natives, region, FAKE_CUDA_CAPTURE_LOG=str(refused))
    p = Probe(natives.probe, env, flavour)
    probes.append(p)
    p.ok("init")
    # Work before the capture leaves the pacer with events in flight, as a training step would.
    p.ok(f"launch {KERNEL_NS} 5")
    exec_handle = p.ok(f"capturekernels 6 {KERNEL_NS} {MODES[mode]}")[0]
    assert not refused.exists(), f"the driver refused: {refused.read_text()}"
    # The captured graph runs: six kernels as one launch.
    p.ok(f"glaunch {exec_handle}")
    assert not refused.exists()


def test_a_captured_graph_is_paced_as_a_whole(natives, make_region, probes, tmp_path):
    log = tmp_path / "k.log"
    region = make_region(share=300)
    p = Probe(natives.probe, shim_env(natives, region, FAKE_CUDA_LOG=str(log)))
    probes.append(p)
    p.ok("init")
    exec_handle = p.ok(f"capturekernels 4 {KERNEL_NS} 0")[0]  # one 8 ms graph
    assert not Path(log).exists() or not log.read_bytes(), "captured kernels must not run"
    p.ok(f"glaunchfor {exec_handle} 3000")
    ratio = busy_ratio(log)
    assert abs(ratio - 0.3) <= TOLERANCE, f"busy {ratio:.3f} for a captured graph at 30 %"


def test_another_threads_global_capture_keeps_pacing_off_events(natives, make_region, probes,
                                                                tmp_path):  # fmt: skip
    """Under a GLOBAL-mode capture no thread of the process may query an event: a paced launch
    on another thread's stream must not either, or that thread's capture is invalidated."""
    refused = tmp_path / "capture.log"
    region = make_region(share=300)
    p = Probe(natives.probe, shim_env(natives, region, FAKE_CUDA_CAPTURE_LOG=str(refused)))
    probes.append(p)
    p.ok("init")
    assert p.ok(f"capturethread 6 {KERNEL_NS}") == ["0"], refused.read_text()
    assert not refused.exists()
