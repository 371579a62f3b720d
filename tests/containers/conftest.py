"""Fixtures for container jobs: a podman that works on this machine and a busybox image.

There is no registry here: :func:`busybox_image` makes a root file system of Debian's static
busybox (its applets as links, an ``/etc/os-release`` of its own) and ``podman import``s it as
``localhost/gpupool-test-busybox:<hash of its contents>`` (so a changed image gets a new tag and
an unchanged one is imported once). Under ``CI=true`` a test that cannot run podman fails;
elsewhere it is skipped with why (install podman, runc and busybox-static: ``.ci/services.sh``).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.containers.engines import CONTAINERS_CONF
from tests.e2e.pool import Pool

OS_RELEASE = 'NAME="gpupool test image"\nID=gpupool-busybox\nVERSION_ID=1\n'
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"
IMAGE_PATH = "/bin:/usr/bin:/opt/image-only/bin"


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"container tests need podman here (CI=true): {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment podman runs with in the tests (the agent writes the same conf)."""
    if os.geteuid() != 0:
        _unavailable("container jobs run podman as root: run the tests as root")
    if shutil.which("podman") is None or shutil.which("runc") is None:
        _unavailable("podman or runc is not installed (.ci/services.sh installs them)")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    done = subprocess.run(
        ["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        _unavailable(f"podman info failed: {done.stderr.strip()[-500:]}")
    return env


def build_rootfs(extra: dict[str, bytes] | None = None, copies: list[Path] | None = None) -> bytes:
    """A tar of a busybox root file system, with ``extra`` files (path -> bytes, executable)
    and ``copies`` of node files at the same paths (a dynamic program's libraries)."""
    busybox = shutil.which("busybox")
    if busybox is None:
        _unavailable("busybox-static is not installed (.ci/services.sh installs it)")
    assert busybox is not None
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:

        def add(name: str, data: bytes, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))

        for folder in ("bin", "etc", "tmp", "opt/image-only/bin", "usr/bin"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = (
                tarfile.DIRTYPE,
                0o1777 if folder == "tmp" else 0o755,
                0,
            )
            tar.addfile(info)
        add("bin/busybox", Path(busybox).read_bytes())
        applets = subprocess.run(
            [busybox, "--list"], check=True, capture_output=True, text=True
        ).stdout
        for applet in sorted(set(applets.split()) - {"busybox"}):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mtime = tarfile.SYMTYPE, "busybox", 0
            tar.addfile(link)
        add("etc/os-release", OS_RELEASE.encode(), 0o644)
        add(
            "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n", 0o644
        )
        add("etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644)
        for name, data in (extra or {}).items():
            add(name, data)
        for path in copies or []:
            add(str(path), path.read_bytes())
    return out.getvalue()


def import_image(env: dict[str, str], name: str, rootfs: bytes, folder: Path) -> str:
    """``localhost/NAME:<hash>`` imported from ``rootfs`` (once per content)."""
    tag = hashlib.sha256(rootfs).hexdigest()[:12]
    image = f"localhost/{name}:{tag}"
    have = subprocess.run(["podman", "image", "exists", image], env=env, check=False)
    if have.returncode == 0:
        return image
    archive = folder / f"{name}.tar"
    archive.write_bytes(rootfs)
    done = subprocess.run(
        ["podman", "import", "--change", f"ENV PATH={IMAGE_PATH}", str(archive), image],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        _unavailable(f"podman import failed: {done.stderr.strip()[-500:]}")
    return image


@pytest.fixture(scope="session")
def busybox_image(podman_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    return import_image(
        podman_env, "gpupool-test-busybox", build_rootfs(), tmp_path_factory.mktemp("image")
    )


class RunAsPool(Pool):
    """Jobs run as the ``nobody`` account (``--run-as nobody``): no root in the container."""

    agent_args = ("--run-as", "nobody")

    def start_server(self) -> None:
        super().start_server()
        self.agent_token.chmod(0o600)
        self.out.chmod(0o777)  # the jobs write their answers there


@pytest.fixture(scope="module")
def cpool(podman_env: dict[str, str]) -> Iterator[Pool]:
    """A server and one agent n1 (2 simulated A100s) whose jobs run as nobody, in a folder
    others may pass (pytest's own are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-containers-", dir="/tmp"))
    root.chmod(0o711)
    p = RunAsPool(root, heartbeat_s=0.5)
    try:
        p.start_server()
        p.start_agent("n1", "2xA100-80GB")
        yield p
    finally:
        p.close()
        shutil.rmtree(root, ignore_errors=True)
