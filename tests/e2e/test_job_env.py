"""A job's environment is the submitter's, like Slurm's: ``FOO=bar gpupool run ...`` sees FOO
(``--export`` ALL by default, NONE, or a list), the job starts in the submit directory, and the
agent's own virtual environment (PATH, VIRTUAL_ENV, PYTHONPATH) never reaches the job.

The pool's agents here run as ``make run`` does from an activated virtual environment: its
``bin`` first on PATH, VIRTUAL_ENV and PYTHONPATH set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.pool import PY, REPO, Pool

VENV_BIN = str(Path(sys.prefix) / "bin")

#: Prints what the job sees, as JSON on one line.
PROBE = (
    "import json, os, shutil; print(json.dumps({'cwd': os.getcwd(), 'env': dict(os.environ), "
    "'python3': shutil.which('python3'), 'files': sorted(os.listdir('.'))}))"
)


class VenvPool(Pool):
    """Agents started from inside gpupool's virtual environment."""

    def _env(self) -> dict[str, str]:
        env = super()._env()
        env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
        env["VIRTUAL_ENV"] = sys.prefix
        env["AGENT_ONLY"] = "from the agent"
        return env


@pytest.fixture(scope="module")
def venv_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    p = VenvPool(tmp_path_factory.mktemp("envpool"))
    try:
        p.start_server()
        p.start_agent("n1")
        yield p
    finally:
        p.close()


def submitter_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's shell: system PATH, no virtual environment, some variables of their own."""
    path = ":".join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":") if p != VENV_BIN)
    return {"PATH": path, "HOME": str(home), "GPUPOOL_HOME": str(home), "LANG": "C.UTF-8", **extra}


def run(
    pool: Pool, cwd: Path, env: dict[str, str], *options: str, probe: str = PROBE
) -> subprocess.CompletedProcess[str]:
    token = (pool.home / "admin-token").read_text().strip()
    cli = [PY, "-m", "gpupool.cli", "run", "--server", pool.url, "--token", token, "-g", "0.25"]
    return subprocess.run(
        [*cli, *options, "--", "python3", "-c", probe],
        check=False,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


def seen(ran: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert ran.returncode == 0, ran.stderr
    return dict(json.loads(ran.stdout.strip().splitlines()[-1]))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "data.txt").write_text("mine\n")
    return folder


def test_run_exports_the_submitters_environment_and_starts_in_the_submit_directory(
    venv_pool: Pool, tmp_path: Path, project: Path
) -> None:
    env = submitter_env(tmp_path, FOO="bar", CUDA_VISIBLE_DEVICES="7", GPUPOOL_JOB_ID="fake")
    got = seen(run(venv_pool, project, env))
    job_env = got["env"]
    assert isinstance(job_env, dict)
    assert job_env["FOO"] == "bar"
    assert got["cwd"] == str(project)
    assert got["files"] == ["data.txt"]
    # reserved names of the submitter's shell are dropped silently, gpupool sets its own
    assert job_env["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    assert job_env["GPUPOOL_JOB_ID"] != "fake"
    # nothing of the agent's virtual environment
    assert VENV_BIN not in str(job_env["PATH"]).split(":")
    assert not str(got["python3"]).startswith(sys.prefix)
    for name in ("VIRTUAL_ENV", "AGENT_ONLY"):
        assert name not in job_env, name
    # the agent's PYTHONPATH (the pool's REPO) is not the job's; the soft isolation mode may
    # put its own memory-cap hook there
    assert str(REPO) not in str(job_env.get("PYTHONPATH", "")).split(":")


def test_export_none_and_a_list_send_only_what_is_named(
    venv_pool: Pool, tmp_path: Path, project: Path
) -> None:
    env = submitter_env(tmp_path, FOO="bar", BAZ="qux")
    none = seen(run(venv_pool, project, env, "--export", "NONE"))
    assert "FOO" not in none["env"]  # type: ignore[operator]
    assert none["cwd"] == str(project)  # still the submit directory, as with sbatch
    listed = seen(run(venv_pool, project, env, "--export", "FOO,EXTRA=1"))
    listed_env = listed["env"]
    assert isinstance(listed_env, dict)
    assert (listed_env["FOO"], listed_env["EXTRA"]) == ("bar", "1")
    assert "BAZ" not in listed_env


@pytest.mark.parametrize(
    ("export", "fragment"),
    [
        ("CUDA_VISIBLE_DEVICES", "--export CUDA_VISIBLE_DEVICES: environment name"),
        ("NOT_SET_ANYWHERE", "--export NOT_SET_ANYWHERE: it is not set in your environment"),
        ("FOO,,", "--export 'FOO,,' has an empty name"),
    ],
)
def test_export_of_a_reserved_or_missing_name_is_refused_and_nothing_submitted(
    venv_pool: Pool, tmp_path: Path, project: Path, export: str, fragment: str
) -> None:
    before = len(venv_pool.get("/v1/jobs?limit=1000")["jobs"])
    ran = run(venv_pool, project, submitter_env(tmp_path, FOO="bar"), "--export", export)
    assert ran.returncode == 2, ran.stderr
    assert fragment in ran.stderr
    assert "Traceback" not in ran.stderr
    assert len(venv_pool.get("/v1/jobs?limit=1000")["jobs"]) == before


def test_a_submit_directory_the_node_cannot_see_falls_back_to_the_jobs_own_folder(
    venv_pool: Pool, tmp_path: Path
) -> None:
    gone = tmp_path / "elsewhere"
    gone.mkdir()
    token = (venv_pool.home / "admin-token").read_text().strip()
    submit = [PY, "-m", "gpupool.cli", "submit", "--server", venv_pool.url, "--token", token]
    ran = subprocess.run(
        [*submit, "-H", "--parsable", "-g", "0.25", "--", "python3", "-c", PROBE],
        check=False,
        env=submitter_env(tmp_path),
        cwd=gone,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    job_id = ran.stdout.strip()
    gone.rmdir()  # as on a node that does not have the submitter's folder
    venv_pool.post(f"/v1/jobs/{job_id}/release", {})
    assert venv_pool.wait_state(job_id, "COMPLETED", "FAILED", "BOOT_FAIL")["state"] == "COMPLETED"
    assert venv_pool.http is not None
    text = venv_pool.http.get(f"/v1/jobs/{job_id}/logs").text
    got = json.loads(text.strip().splitlines()[-1])
    assert got["cwd"] != str(gone)
    assert got["files"] == []
    assert got["env"]["PWD"] == got["cwd"]
