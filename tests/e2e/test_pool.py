"""End to end with real processes and no GPU: one server, two agents of 4 simulated A100s."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.e2e.pool import PY, REPO, Pool, wait_for

SHARES = ["0.25", "0.5", "250m", "10%", "0.3"]


def test_twenty_fractional_jobs_complete_with_the_right_devices_and_slices(pool: Pool) -> None:
    jobs = {}
    for i in range(20):
        share = SHARES[i % len(SHARES)]
        jobs[f"frac{i}"] = pool.submit(
            f"frac{i}", "sleep=0.5", resources={"gpus": share, "gpu_memory": "8GiB"}
        )
    for job_id in jobs.values():
        done = pool.wait_state(job_id, "COMPLETED", "FAILED", timeout=120)
        assert done["state"] == "COMPLETED", done
        assert done["exit_code"] == 0
    where = pool.device_nodes()
    milli = {"0.25": 250, "0.5": 500, "250m": 250, "10%": 100, "0.3": 300}
    for i, name in enumerate(jobs):
        record = pool.record(name)
        assert record is not None, name
        env = record["env"]
        uuids = env["CUDA_VISIBLE_DEVICES"].split(",")
        assert len(uuids) == 1
        assert where[uuids[0]] == env["GPUPOOL_NODE"]  # a device of the node it ran on
        assert env["GPUPOOL_GPU_MILLI"] == str(milli[SHARES[i % len(SHARES)]])
        assert env["GPUPOOL_GPU_MEMORY_MIB"] == "8192"
        assert env["GPUPOOL_JOB_ID"] == jobs[name]
        assert env["GPUPOOL_ISOLATION"] == "soft"
        assert pool.job(jobs[name])["isolation"] == "soft"
    assert {pool.record(n)["env"]["GPUPOOL_NODE"] for n in jobs} == {"n1", "n2"}  # type: ignore[index]


def test_high_priority_preempts_low_which_resumes_from_its_checkpoint(pool: Pool) -> None:
    low = [
        pool.submit(
            f"low{i}", "trap", "forever", priority="low", preemptible=True, resources={"gpus": 4}
        )
        for i in range(2)
    ]
    for job_id in low:
        pool.wait_state(job_id, "RUNNING")
    wait_for(lambda: all(pool.record(f"low{i}") for i in range(2)), 30, "low jobs started")
    high = pool.submit("high", "sleep=1", priority="high", resources={"gpus": 4})
    done = pool.wait_state(high, "COMPLETED", timeout=90)
    assert done["exit_code"] == 0
    preempted = [i for i in range(2) if (pool.record(f"low{i}") or {}).get("got_sigterm")]
    assert len(preempted) == 1, "exactly one low job made room"
    name = f"low{preempted[0]}"
    job = pool.wait_state(low[preempted[0]], "COMPLETED", timeout=90)
    assert job["restart_count"] == 1
    first, second = pool.record(name, restart=0), pool.record(name, restart=1)
    assert first is not None
    assert second is not None
    assert second["env"]["GPUPOOL_RESTART_COUNT"] == "1"
    assert second["env"]["GPUPOOL_CHECKPOINT_DIR"] == first["env"]["GPUPOOL_CHECKPOINT_DIR"]
    assert second["found_checkpoint"] is True
    assert pool.starts(name) == [0, 1]
    other = low[1 - preempted[0]]
    assert pool.job(other)["state"] == "RUNNING"
    pool.post(f"/v1/jobs/{other}/cancel", {})
    pool.wait_state(other, "CANCELLED", timeout=60)


def test_a_gang_starts_on_two_nodes_with_consistent_rendezvous(pool: Pool) -> None:
    job_id = pool.submit("gang", "rendezvous", replicas=2, resources={"gpus": 4})
    done = pool.wait_state(job_id, "COMPLETED", "FAILED", timeout=90)
    assert done["state"] == "COMPLETED", done
    r0, r1 = pool.record("gang", 0), pool.record("gang", 1)
    assert r0 is not None
    assert r1 is not None
    e0, e1 = r0["env"], r1["env"]
    assert e0["MASTER_ADDR"] == e1["MASTER_ADDR"]
    assert e0["MASTER_PORT"] == e1["MASTER_PORT"]
    assert e0["WORLD_SIZE"] == e1["WORLD_SIZE"] == "2"
    assert {e0["RANK"], e1["RANK"]} == {"0", "1"}
    assert {e0["GPUPOOL_NODE"], e1["GPUPOOL_NODE"]} == {"n1", "n2"}
    assert e0["LOCAL_RANK"] == e1["LOCAL_RANK"] == "0"
    assert r0["peer"] == "hello from rank 1"  # both ran at once and met at MASTER_ADDR:PORT


def test_a_jobs_output_reaches_gpupool_logs_through_the_server(pool: Pool, tmp_path: Path) -> None:
    program = (
        "import sys, time\n"
        "for i in range(3):\n"
        "    print(f'line {i}', flush=True); time.sleep(0.7)\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    spec = {"name": "talker", "command": [PY, "-c", program], "resources": {"gpus": "0.25"}}
    job_id = pool.post("/v1/jobs", {"spec": spec})["job"]["id"]
    pool.wait_state(job_id, "RUNNING", "COMPLETED")
    token = (pool.home / "admin-token").read_text().strip()
    # A client on another machine: its own empty home, nothing of the agent's folders.
    env = {**os.environ, "GPUPOOL_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    cli = [PY, "-m", "gpupool.cli", "logs", job_id, "--server", pool.url, "--token", token]
    followed = subprocess.run(
        [*cli, "-f"], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == "line 0\nline 1\nline 2\n"
    assert pool.wait_state(job_id, "COMPLETED")["exit_code"] == 0
    errors = subprocess.run(
        [*cli, "--stderr"], check=True, env=env, capture_output=True, text=True, timeout=60
    )
    assert errors.stdout == "to stderr\n"


def test_a_job_run_with_workdir_reads_a_file_from_its_uploaded_folder(
    pool: Pool, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    (folder / ".git").mkdir(parents=True)
    (folder / "data.txt").write_text("from the upload\n")
    program = "import os; print(open('data.txt').read().strip(), os.path.exists('.git'))"
    token = (pool.home / "admin-token").read_text().strip()
    env = {**os.environ, "GPUPOOL_HOME": str(tmp_path / "client"), "PYTHONPATH": str(REPO)}
    cli = [PY, "-m", "gpupool.cli", "run", "--workdir", str(folder), "-g", "0.25"]
    ran = subprocess.run(
        [*cli, "--server", pool.url, "--token", token, "--", PY, "-c", program],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "from the upload False\n"


def test_an_mlflow_run_inside_a_job_is_tagged_with_the_job(pool: Pool, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    seen = tmp_path / "tags.txt"
    program = (
        "import sys, mlflow\n"
        "with mlflow.start_run() as run:\n"
        "    mlflow.log_metric('loss', 0.5)\n"
        "tags = mlflow.get_run(run.info.run_id).data.tags\n"
        "open(sys.argv[1], 'w').write(' '.join(\n"
        "    tags[k] for k in ('gpupool.job_id', 'gpupool.job_name', 'gpupool.slice')))\n"
    )
    spec = {
        "name": "tracked",
        "command": [PY, "-c", program, str(seen)],
        "resources": {"gpus": "0.25"},
        "env": {"MLFLOW_TRACKING_URI": store},
    }
    job_id = pool.post("/v1/jobs", {"spec": spec})["job"]["id"]
    done = pool.wait_state(job_id, "COMPLETED", "FAILED", timeout=120)
    assert done["state"] == "COMPLETED", done
    assert seen.read_text() == f"{job_id} tracked 0.25"
