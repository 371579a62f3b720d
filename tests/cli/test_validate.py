"""`gpupool validate FILE` checks a job file like `sbatch --test-only`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpupool.client import Client
from tests.api.server_proc import ServerProcess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
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


def test_validate_refuses_what_the_reachable_server_would_refuse(tmp_path: Path) -> None:
    """examples/train.yaml names tenant 'vision': a fresh pool has no such tenant, so
    ``submit`` refuses it, and ``validate`` (against that server) must say so too."""
    example = str(EXAMPLES / "train.yaml")
    with ServerProcess(tmp_path / "home") as server:
        env = {**os.environ, "GPUPOOL_SERVER": server.url, "GPUPOOL_TOKEN": server.admin_token()}
        submitted = run_cli("submit", "-f", example, env=env)
        assert submitted.returncode == 2
        assert "tenant 'vision' does not exist" in submitted.stderr
        checked = run_cli("validate", example, env=env)
        assert checked.returncode == 1, checked.stdout
        assert f"{example}: tenant: 'vision' does not exist: ask an admin" in checked.stderr
        assert f"the server at {server.url} would refuse this job" in checked.stderr
        # Once the tenant exists, both agree the file is good, and validate says it asked.
        with Client(server.url, server.admin_token()) as gp:
            gp.request("PUT", "/v1/tenants/vision", json={"fair_share": 1.0})
        checked = run_cli("validate", example, env=env)
        assert checked.returncode == 0, checked.stderr
        assert checked.stdout.splitlines()[-1] == (
            f"checked: the file and the server at {server.url} (tenant, pool, priority class)"
        )
        offline = run_cli("validate", "--offline", example, env=env)
        assert offline.stdout.splitlines()[-1] == "checked: the file only (--offline)"


def test_validate_without_a_reachable_server_checks_the_file_and_says_so() -> None:
    env = {**os.environ, "GPUPOOL_SERVER": "http://127.0.0.1:9", "GPUPOOL_TOKEN": "gp_x"}
    checked = run_cli("validate", str(EXAMPLES / "train.yaml"), env=env)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines()[-1].startswith(
        "checked: the file only (cannot reach http://127.0.0.1:9"
    )
