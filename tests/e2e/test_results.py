"""``gpupool fetch JOB DEST``: what a job wrote under its uploaded working directory comes back
(its node sends the copy when the job ends), to its owners only."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e.pool import PY, Pool

WRITER = (
    "import os; os.makedirs('out', exist_ok=True); "
    "open('out/result.txt', 'w').write(open('input.txt').read().upper())"
)


def gpupool(pool: Pool, home: Path, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    # the tree under test (the caller's PYTHONPATH first), not the installed one
    env = {**pool._env(), "GPUPOOL_HOME": str(home)}
    command, rest = args[0], args[1:]
    return subprocess.run(
        [PY, "-m", "gpupool.cli", command, "--server", pool.url, "--token", token, *rest],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=home,
    )


def test_fetch_brings_back_what_a_job_wrote_in_its_uploaded_folder_to_its_owner_only(
    pool: Pool, tmp_path: Path
) -> None:
    admin = (pool.home / "admin-token").read_text().strip()
    project = tmp_path / "project"
    project.mkdir()
    (project / "input.txt").write_text("hello\n")
    ran = gpupool(
        pool, tmp_path, admin, "run", "--workdir", str(project), "-g", "0.25",
        "--", PY, "-c", WRITER,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    job_id = ran.stderr.split()[2]
    assert not (project / "out").exists()  # the job wrote in its copy, on the node

    dest = tmp_path / "fetched"
    got = gpupool(pool, tmp_path, admin, "fetch", job_id, str(dest))
    assert got.returncode == 0, got.stderr
    assert (dest / "out" / "result.txt").read_text() == "HELLO\n"
    assert (dest / "input.txt").read_text() == "hello\n"
    assert f"into {dest}" in got.stderr

    again = gpupool(pool, tmp_path, admin, "fetch", job_id, str(dest))
    assert again.returncode != 0
    assert "is not an empty folder: give a new or empty folder" in again.stderr

    pool.http.put("/v1/tenants/elsewhere", json={"fair_share": 1.0})  # type: ignore[union-attr]
    pool.post("/v1/users", {"name": "stranger", "role": "member", "tenant": "elsewhere"})
    stranger = pool.post("/v1/tokens", {"user": "stranger"})["secret"]
    hidden = gpupool(pool, tmp_path, stranger, "fetch", job_id, str(tmp_path / "theirs"))
    assert hidden.returncode == 3, hidden.stderr
    assert "not found" in hidden.stderr
    assert not (tmp_path / "theirs").exists()


def test_fetch_of_a_job_without_an_upload_says_where_its_files_are(
    pool: Pool, tmp_path: Path
) -> None:
    admin = (pool.home / "admin-token").read_text().strip()
    ran = gpupool(pool, tmp_path, admin, "run", "-g", "0.25", "--", "true")
    assert ran.returncode == 0, ran.stderr
    job_id = ran.stderr.split()[2]
    got = gpupool(pool, tmp_path, admin, "fetch", job_id, str(tmp_path / "none"))
    assert got.returncode == 6, got.stderr  # the job is there, but has nothing to fetch
    assert "has no results to fetch: only a job submitted with --workdir DIR" in got.stderr
