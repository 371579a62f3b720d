"""Jobs in container images through the real server, agent, supervisor, podman and CLI.

Each test submits with ``--image`` (a busybox image the fixture imported) and checks what the
job saw from inside: the image's own files and ``PATH``, the slice, its account; and what came
back: stdout, stderr and exit code byte for byte.
"""

from __future__ import annotations

import os
import subprocess

from tests.containers.conftest import IMAGE_PATH, OS_RELEASE
from tests.e2e.pool import PY, REPO, Pool

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
