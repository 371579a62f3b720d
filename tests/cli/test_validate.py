"""`gpupool validate FILE` checks a job file like `sbatch --test-only`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_validate_accepts_the_example() -> None:
    result = run_cli("validate", str(EXAMPLES / "train.yaml"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: train-resnet: 1 x 0.5 GPU, gpu memory 20GiB")


def test_validate_names_the_line_and_the_fix_of_the_broken_example() -> None:
    result = run_cli("validate", str(EXAMPLES / "broken.yaml"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(
        "broken.yaml:6: resources.gpu_mem: unknown key: did you mean 'resources.gpu_memory'?"
    )
    assert "broken.yaml:8: env.CUDA_VISIBLE_DEVICES:" in lines[1]
    assert "Traceback" not in result.stderr


def test_validate_missing_file_is_one_line() -> None:
    result = run_cli("validate", "/nonexistent/job.yaml")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: cannot read /nonexistent/job.yaml: No such file or directory"
    )
