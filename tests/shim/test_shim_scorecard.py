"""scripts/shim-scorecard.sh on this CPU machine: a stand-in nvidia-smi and the fake driver let
its driver-API memory row run for real; the rows needing PyTorch, JAX, CuPy or nvcc skip with
their reason, and the exit code and JSON follow the contract scripts/gpu-check.sh relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.shim.helpers import fake_uuid

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "shim-scorecard.sh"
CTX = 300 * (1 << 20) + 4096  # the fake driver's context cost


def fake_nvidia_smi(folder: Path) -> None:
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *-L*) echo "GPU 0: Fake GPU (UUID: {fake_uuid(0)})";; '
        f'*) echo "{fake_uuid(0)}, Fake GPU, 81920, 999.99";; esac\n'
    )
    smi.chmod(0o755)


def run(tmp_path: Path, natives, path: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": path,
        "PYTHON": sys.executable,
        "GPUPOOL_REAL_LIBCUDA": str(natives.fake),
        "GPUPOOL_SHIM_DIR": str(natives.shim.root.parent),
        "GPU_CHECK_LEFT_S": "120",
        "OUT": str(tmp_path),
        "HOME": str(tmp_path),
        "FAKE_CUDA_CTX_BYTES": str(CTX),
        "NVCC": "",  # this machine's nvcc builds against cudart, which the fake driver cannot serve
    }
    return subprocess.run(
        [str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_scorecard_runs_its_memory_row_and_skips_what_is_missing(natives, tmp_path):
    fake_nvidia_smi(tmp_path / "bin")
    # No nvcc, PyTorch, JAX or CuPy on this PATH / in this Python.
    proc = run(tmp_path, natives, f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    card = json.loads((tmp_path / "shim-scorecard.json").read_text())
    assert card["driver"] == "999.99"
    rows = {r["check"]: r for r in card["rows"]}
    accuracy = rows["memory-limit accuracy (driver API)"]
    assert accuracy["result"] == "ok"
    assert accuracy["value"] == "100.00 %"
    assert rows["cuMemGetInfo total = slice"]["result"] == "ok"
    assert rows["nvcc-built CUDA program stops at the slice"]["note"] == "no nvcc"
    assert "| memory-limit accuracy (driver API) | 100.00 % |" in proc.stdout
    # The new checks run on the fake driver too: the fake's context cost is measured and a
    # slice reaches exactly limit - reserve; graph memory is refused, counted, trimmed.
    assert rows["context reserve measured"]["value"].startswith(f"{CTX} bytes")
    assert rows["reachable = limit - reserve"]["result"] == "ok"
    assert rows["reachable = limit - reserve"]["value"].startswith("100.00 %")
    assert rows["graph memory capped"]["result"] == "ok", rows["graph memory capped"]
    assert rows["mps+shim memory per replica"]["note"] == "no nvidia-cuda-mps-control"
    # Issue 25's rows that run without a GPU: every hook handed out as the driver's variant,
    # the driver's names all in the façade; the NVML row skips without per-process figures.
    assert rows["cuGetProcAddress pointer identity (every hook)"]["result"] == "ok", rows
    assert rows["real libcuda.so.1 names in the façade"]["result"] == "ok"
    assert rows["NVML per-process memory vs charged"]["result"] == "skipped"


def test_the_scorecard_says_so_when_there_is_no_gpu(natives, tmp_path):
    proc = run(tmp_path, natives, "/usr/bin:/bin")
    assert proc.returncode == 2
    assert "no NVIDIA GPU" in proc.stderr
    assert os.path.exists(SCRIPT)


def test_the_scorecard_runs_mps_shim_where_mps_control_is_installed(natives, tmp_path):
    from tests.agent.fake_mps import install

    fake_nvidia_smi(tmp_path / "bin")
    install(tmp_path / "bin", sys.executable)  # a stand-in nvidia-cuda-mps-control
    proc = run(tmp_path, natives, f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {
        r["check"]: r for r in json.loads((tmp_path / "shim-scorecard.json").read_text())["rows"]
    }
    got = rows["mps+shim memory per replica"]
    assert got["result"] == "ok", got
    assert got["value"] == "100.00 %, shim share 1000"  # the shim's limit, MPS paces
