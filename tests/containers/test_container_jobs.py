"""Jobs in container images through the real server, agent, supervisor, podman and CLI.

Each test submits with ``--image`` (a busybox image the fixture imported) and checks what the
job saw from inside: the image's own files and ``PATH``, the slice, its account; and what came
back: stdout, stderr and exit code byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.containers.conftest import IMAGE_PATH, OS_RELEASE
from tests.e2e.pool import PY, REPO, Pool, wait_for

TIMEOUT = 180.0


def cli(pool: Pool, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    token = (pool.home / "admin-token").read_text().strip()
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)
    env = {**os.environ, "GPUPOOL_HOME": str(pool.root / "cli-home"), "PYTHONPATH": path}
    return subprocess.run(
        [PY, "-m", "gpupool.cli", *args[:1], "--server", pool.url, "--token", token, *args[1:]],
        check=False,
        env=env,
        capture_output=True,
        timeout=timeout,
        cwd=pool.root,
    )


def test_a_job_in_an_image_prints_from_inside_it_byte_for_byte(
    cpool: Pool, busybox_image: str
) -> None:
    script = (
        "cat /etc/os-release; echo PATH=$PATH; echo uid=$(id -u); "
        "echo CVD=$CUDA_VISIBLE_DEVICES; echo FROM_EXPORT=$FROM_EXPORT; "
        "printf 'err \\xce\\xb2 no newline' >&2; exit 3"
    )
    done = cli(
        cpool,
        "run",
        "--image",
        busybox_image,
        "-g",
        "0.5",
        "--export",
        "FROM_EXPORT=exported-value",
        "--",
        "sh",
        "-c",
        script,
    )
    out = done.stdout.decode()
    assert out.startswith(OS_RELEASE), (out, done.stderr)
    assert f"PATH={IMAGE_PATH}\n" in out  # the image's PATH, not the node's
    assert "uid=65534\n" in out  # the job's account (nobody), not root
    assert "FROM_EXPORT=exported-value\n" in out
    cvd = out.split("CVD=")[1].split("\n")[0]
    assert cvd.startswith("GPU-")
    assert "," not in cvd  # its one GPU, by UUID
    assert out == (
        f"{OS_RELEASE}PATH={IMAGE_PATH}\nuid=65534\nCVD={cvd}\nFROM_EXPORT=exported-value\n"
    )
    assert done.returncode == 3
    job_id = done.stderr.decode().split("Submitted job ")[1].split()[0]
    logs = cli(cpool, "logs", job_id, "--stderr")
    assert logs.stdout == "err \u03b2 no newline".encode(), logs
    shown = cli(cpool, "show", job_id)
    assert busybox_image in shown.stdout.decode()
    # The image was on the node: no pull, and no progress event for one.
    done = cpool.state_dir("n1") / "done"
    (log,) = [
        p.parent / "prepare.log"
        for p in done.glob("*/assignment.json")
        if json.loads(p.read_text())["assignment"]["job_id"] == job_id
    ]
    assert "Trying to pull" not in log.read_text()
    events = cpool.get(f"/v1/jobs/{job_id}/events")
    assert not [e for e in events if e["source"] == e["target"] == "CONFIGURING"], events


def submit(pool: Pool, image: str, name: str, script: str, **spec: Any) -> str:
    """Submit ``script`` (shell text, run by the image's sh) in ``image``, with the pool's
    ``out`` folder mounted at ``/out``."""
    container = {"image": image, "mounts": [f"{pool.out}:/out"], **spec.pop("container", {})}
    body = {"name": name, "script": script, "container": container, **spec}
    return str(pool.post("/v1/jobs", {"spec": body})["job"]["id"])


def containers(env: dict[str, str]) -> list[str]:
    """Names of gpupool's containers on this machine, running or not."""
    done = subprocess.run(
        ["podman", "ps", "--all", "--format", "{{.Names}}", "--filter", "name=gpupool-"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def assignment_of(pool: Pool, job_id: str) -> str:
    jobs = pool.root / "agents" / "n1" / "jobs"
    for record in jobs.glob("*/assignment.json"):
        if json.loads(record.read_text())["assignment"]["job_id"] == job_id:
            return record.parent.name
    raise AssertionError(f"no replica folder of job {job_id} under {jobs}")


def test_cancel_ends_the_whole_container_even_one_that_ignores_the_signal(
    cpool: Pool, busybox_image: str, podman_env: dict[str, str]
) -> None:
    job_id = submit(
        cpool,
        busybox_image,
        "stubborn",
        "trap '' TERM; echo started > /out/stubborn.started; while true; do sleep 1; done",
        checkpoint={"grace": "2s"},
    )
    cpool.wait_state(job_id, "RUNNING", timeout=TIMEOUT)
    wait_for((cpool.out / "stubborn.started").exists, TIMEOUT, "the job's start")
    key = assignment_of(cpool, job_id)
    name = f"gpupool-{key}"
    assert name in containers(podman_env)
    cdi = Path("/var/run/cdi") / f"gpupool-{key}.json"
    assert json.loads(cdi.read_text())["devices"][0]["name"] == key
    assert cdi.stat().st_mode & 0o077 == 0  # it names the replica's region: root's only
    done = cli(cpool, "cancel", job_id)
    assert done.returncode == 0, done
    cpool.wait_state(job_id, "CANCELLED", timeout=TIMEOUT)
    wait_for(lambda: name not in containers(podman_env), TIMEOUT, f"{name} removed")
    wait_for(lambda: not cdi.exists(), TIMEOUT, f"{cdi} removed")


def test_the_checkpoint_signal_reaches_the_job_inside_and_its_checkpoint_survives_requeue(
    cpool: Pool, busybox_image: str
) -> None:
    script = (
        'ck="$GPUPOOL_CHECKPOINT_DIR/state"; '
        'if [ -e "$ck" ]; then '
        'echo "found $(cat $ck)" > /out/ckpt.$GPUPOOL_RESTART_COUNT; exit 0; fi; '
        "trap 'echo saved > \"$ck\"; echo got USR1; exit 0' USR1; "
        "echo first > /out/ckpt.started; while true; do sleep 0.2; done"
    )
    low = submit(
        cpool,
        busybox_image,
        "ckpt",
        script,
        priority="low",
        preemptible=True,
        resources={"gpus": 2, "cpus": "100m"},
        checkpoint={"signal": "SIGUSR1", "grace": "60s"},
    )
    cpool.wait_state(low, "RUNNING", timeout=TIMEOUT)
    wait_for((cpool.out / "ckpt.started").exists, TIMEOUT, "the low job's start")
    high = submit(cpool, busybox_image, "high", "echo high", priority="high", resources={"gpus": 1})
    assert cpool.wait_state(high, "COMPLETED", timeout=TIMEOUT)["state"] == "COMPLETED"
    wait_for((cpool.out / "ckpt.1").exists, TIMEOUT, "the requeued run")
    assert (cpool.out / "ckpt.1").read_text() == "found saved\n"
    assert cpool.wait_state(low, "COMPLETED", timeout=TIMEOUT)["restart_count"] == 1
    events = cpool.get(f"/v1/jobs/{low}/events")
    assert any(f"preempted for job {high}" in str(e) for e in events), events


def test_an_agent_killed_and_restarted_readopts_its_running_container(
    cpool: Pool, busybox_image: str, podman_env: dict[str, str]
) -> None:
    job_id = submit(
        cpool,
        busybox_image,
        "adopt",
        "echo run >> /out/adopt.runs; while [ ! -e /out/adopt.go ]; do sleep 0.2; done; "
        "echo finished; exit 5",
    )
    cpool.wait_state(job_id, "RUNNING", timeout=TIMEOUT)
    wait_for((cpool.out / "adopt.runs").exists, TIMEOUT, "the job's start")
    name = f"gpupool-{assignment_of(cpool, job_id)}"
    cpool.kill_agent("n1")
    assert name in containers(podman_env)  # the container outlives its agent
    cpool.start_agent("n1", "2xA100-80GB")
    (cpool.out / "adopt.go").touch()
    done = cpool.wait_state(job_id, "FAILED", "COMPLETED", timeout=TIMEOUT)
    assert (done["state"], done["exit_code"]) == ("FAILED", 5)
    assert (cpool.out / "adopt.runs").read_text() == "run\n"  # adopted, never started twice
    assert cli(cpool, "logs", job_id).stdout == b"finished\n"
    wait_for(lambda: name not in containers(podman_env), TIMEOUT, f"{name} removed")


def test_a_killed_supervisor_leaves_no_container_behind(
    cpool: Pool, busybox_image: str, podman_env: dict[str, str]
) -> None:
    job_id = submit(
        cpool,
        busybox_image,
        "orphan",
        "echo up > /out/orphan.started; while true; do sleep 0.2; done",
        max_restarts=0,
    )
    cpool.wait_state(job_id, "RUNNING", timeout=TIMEOUT)
    wait_for((cpool.out / "orphan.started").exists, TIMEOUT, "the job's start")
    key = assignment_of(cpool, job_id)
    name = f"gpupool-{key}"
    state = json.loads((cpool.state_dir("n1") / "jobs" / key / "state.json").read_text())
    os.kill(state["supervisor_pid"], signal.SIGKILL)  # the node's agent must clean up
    done = cpool.wait_state(job_id, "FAILED", "NODE_FAIL", "COMPLETED", timeout=TIMEOUT)
    assert "supervisor process ended without recording a result" in (done["reason"] or ""), done
    wait_for(lambda: name not in containers(podman_env), TIMEOUT, f"{name} removed")
    cdi = Path("/var/run/cdi") / f"gpupool-{key}.json"
    wait_for(lambda: not cdi.exists(), TIMEOUT, f"{cdi} removed")


def test_the_time_limit_ends_the_container(
    cpool: Pool, busybox_image: str, podman_env: dict[str, str]
) -> None:
    job_id = submit(
        cpool,
        busybox_image,
        "limited",
        "echo up > /out/limited.started; while true; do sleep 0.2; done",
        time_limit="3s",
        checkpoint={"grace": "1s"},
        max_restarts=0,
    )
    cpool.wait_state(job_id, "RUNNING", timeout=TIMEOUT)
    wait_for((cpool.out / "limited.started").exists, TIMEOUT, "the job's start")
    name = f"gpupool-{assignment_of(cpool, job_id)}"
    done = cpool.wait_state(job_id, "TIMEOUT", "FAILED", "COMPLETED", timeout=TIMEOUT)
    assert done["state"] == "TIMEOUT", done
    wait_for(lambda: name not in containers(podman_env), TIMEOUT, f"{name} removed")


def test_a_gangs_replicas_in_containers_rendezvous_on_master_addr(
    cpool: Pool, busybox_image: str
) -> None:
    script = (
        'if [ "$RANK" = 0 ]; then nc -l -p "$MASTER_PORT" > /out/gang.heard; '
        "else for i in $(seq 1 100); do "
        'echo "hello from $RANK of $WORLD_SIZE" | nc "$MASTER_ADDR" "$MASTER_PORT" && break; '
        "sleep 0.2; done; fi"
    )
    job_id = submit(
        cpool, busybox_image, "gang", script, replicas=2, resources={"gpus": 1}, max_restarts=0
    )
    done = cpool.wait_state(job_id, "COMPLETED", "FAILED", timeout=TIMEOUT)
    assert done["state"] == "COMPLETED", done
    assert (cpool.out / "gang.heard").read_text() == "hello from 1 of 2\n"
