"""``gpupool precheck --kubernetes`` on the node's container runtime: CDI on, NVIDIA's toolkit.

Through the CLI, as a user runs it: on this machine as it is, then on node file systems laid out
under ``GPUPOOL_HOST_ROOT`` (how the check runs in a pod with the node's ``/`` at ``/host``) with
the configurations a node really has: containerd 1.7 without CDI, CDI on but not reading
``/var/run/cdi``, containerd 2.x with NVIDIA's runtime as the default one (which hands every GPU
to an image that sets ``NVIDIA_VISIBLE_DEVICES=all``), the toolkit set up safely, CRI-O, and a
config file that does not parse. Every FAIL and WARN carries its fix. No API server is needed
for these checks (``KUBECONFIG`` names no file: the API checks fail and skip, these still run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONTAINERD_17 = """\
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
"""
CONTAINERD_17_CDI_ETC_ONLY = """\
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi"]
"""
CONTAINERD_2 = """\
version = 3
imports = ["/etc/containerd/conf.d/*.toml"]
"""
# What `nvidia-ctk runtime configure --runtime=containerd --set-as-default` drops in.
NVIDIA_DROP_IN = """\
version = 3
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "nvidia"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""
CRIO_DROP_IN = """\
[crio.runtime]
default_runtime = "crun"
cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
"""


def _precheck(host_root: Path | None) -> tuple[int, dict[str, dict[str, str]]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "KUBECONFIG": "/nonexistent"}
    env.pop("GPUPOOL_HOST_ROOT", None)
    if host_root is not None:
        env["GPUPOOL_HOST_ROOT"] = str(host_root)
    done = subprocess.run(
        [sys.executable, "-c", "from gpupool.cli.main import main; main()", "precheck",
         "--kubernetes", "--json", "--only", "disk"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.stdout, done.stderr
    return done.returncode, {r["name"]: r for r in json.loads(done.stdout)}


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_on_this_machine_the_runtime_check_says_what_it_found() -> None:
    code, rows = _precheck(None)
    assert code == 1  # no API server named
    assert rows["k8s-api"]["status"] == "FAIL"
    runtime = rows["cdi-runtime"]
    if Path("/etc/containerd/config.toml").exists() or Path("/etc/crio").exists():
        assert runtime["status"] in ("PASS", "FAIL"), runtime
        return
    # This machine runs podman, not a Kubernetes runtime: said so, with what a node needs.
    assert runtime["status"] == "FAIL", runtime
    assert "no containerd" in runtime["detail"], runtime
    assert "GPUPOOL_HOST_ROOT" in runtime["fix"], runtime
    assert "enable_cdi = true" in runtime["fix"], runtime
    assert rows["nvidia-runtime"]["status"] in ("PASS", "WARN"), rows["nvidia-runtime"]
    assert rows["nvidia-runtime"]["fix"] or rows["nvidia-runtime"]["status"] == "PASS"


def test_containerd_1_7_without_cdi_fails_with_the_setting_to_add(tmp_path: Path) -> None:
    _write(tmp_path, "etc/containerd/config.toml", CONTAINERD_17)
    _, rows = _precheck(tmp_path)
    runtime = rows["cdi-runtime"]
    assert runtime["status"] == "FAIL", runtime
    assert "CDI is off" in runtime["detail"], runtime
    assert "enable_cdi = true" in runtime["fix"], runtime
    assert "io.containerd.grpc.v1.cri" in runtime["fix"], runtime
    nvidia = rows["nvidia-runtime"]
    assert nvidia["status"] == "WARN", nvidia
    assert "nvidia-ctk cdi generate" in nvidia["fix"], nvidia


def test_cdi_on_but_not_reading_the_plugins_folder_fails(tmp_path: Path) -> None:
    _write(tmp_path, "etc/containerd/config.toml", CONTAINERD_17_CDI_ETC_ONLY)
    _, rows = _precheck(tmp_path)
    runtime = rows["cdi-runtime"]
    assert runtime["status"] == "FAIL", runtime
    assert "not /var/run/cdi" in runtime["detail"], runtime
    assert 'add "/var/run/cdi" to cdi_spec_dirs' in runtime["fix"], runtime


def test_nvidia_runtime_as_default_is_a_warning_until_it_ignores_the_env(tmp_path: Path) -> None:
    _write(tmp_path, "etc/containerd/config.toml", CONTAINERD_2)
    _write(tmp_path, "etc/containerd/conf.d/99-nvidia.toml", NVIDIA_DROP_IN)
    _, rows = _precheck(tmp_path)
    assert rows["cdi-runtime"]["status"] == "PASS", rows["cdi-runtime"]
    assert "/var/run/cdi" in rows["cdi-runtime"]["detail"]
    nvidia = rows["nvidia-runtime"]
    assert nvidia["status"] == "WARN", nvidia
    assert "NVIDIA_VISIBLE_DEVICES=all" in nvidia["detail"], nvidia
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged = false" in nvidia["fix"]

    _write(tmp_path, "etc/nvidia-container-runtime/config.toml",
           "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")  # fmt: skip
    _write(tmp_path, "usr/bin/nvidia-ctk", "#!/bin/sh\n")
    _write(tmp_path, "etc/cdi/nvidia.yaml", "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\n")
    _, rows = _precheck(tmp_path)
    nvidia = rows["nvidia-runtime"]
    assert nvidia["status"] == "PASS", nvidia
    for seen in ("nvidia-ctk at", "containerd runtime 'nvidia'", "etc/cdi/nvidia.yaml"):
        assert seen in nvidia["detail"], nvidia
    assert rows["cdi"]["status"] == "PASS", rows["cdi"]


def test_crio_passes_and_a_broken_config_is_named(tmp_path: Path) -> None:
    _write(tmp_path, "etc/crio/crio.conf.d/10-gpupool.conf", CRIO_DROP_IN)
    _, rows = _precheck(tmp_path)
    assert rows["cdi-runtime"]["status"] == "PASS", rows["cdi-runtime"]
    assert "CRI-O: CDI on" in rows["cdi-runtime"]["detail"]

    _write(tmp_path, "etc/containerd/config.toml", "version = 3\n[plugins\n")
    _, rows = _precheck(tmp_path)
    runtime = rows["cdi-runtime"]
    assert runtime["status"] == "FAIL", runtime
    assert "etc/containerd/config.toml" in runtime["detail"], runtime
    assert runtime["fix"], runtime


@pytest.mark.parametrize("version", ["", "version = 1\n"])
def test_a_containerd_too_old_for_cdi_is_refused_by_name(tmp_path: Path, version: str) -> None:
    _write(tmp_path, "etc/containerd/config.toml", version + "[plugins]\n")
    _, rows = _precheck(tmp_path)
    runtime = rows["cdi-runtime"]
    assert runtime["status"] == "FAIL", runtime
    assert "containerd 1.7" in runtime["detail"], runtime
