"""The slice as CDI container edits (pure), engine plans (pure) and job-file parsing."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from gpupool.client.sdk import options_to_spec
from gpupool.containers.cdi import (
    CDI_KIND,
    DRIVER_DIR,
    REGION_PATH,
    SHIM_DIR,
    ContainerEdits,
    SliceInputs,
    cdi_spec,
    driver_libraries,
    gpu_device_nodes,
    slice_edits,
)
from gpupool.containers.engines import ENGINES, ContainerJob
from gpupool.domain.containers import Mount, image_registry, registry_allowed
from gpupool.domain.errors import SpecError
from gpupool.domain.jobspec import build_spec, parse_job_yaml

LDCACHE = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6) => /usr/lib/i386-linux-gnu/libnvidia-ml.so.1
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so
\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
"""


def test_driver_libraries_come_from_the_loaders_cache_native_and_by_soname() -> None:
    assert driver_libraries(LDCACHE) == {
        "libnvidia-ml.so.1": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "libcuda.so.1": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    }


def test_only_the_assigned_gpus_nodes_and_existing_control_nodes() -> None:
    existing = frozenset({"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl"})
    assert gpu_device_nodes([2], existing) == ("/dev/nvidia2", "/dev/nvidiactl")
    assert gpu_device_nodes([0], frozenset()) == ()  # a node without a driver: none


def test_a_shim_slice_becomes_facade_first_region_driver_and_visible_devices() -> None:
    inputs = SliceInputs(
        device_nodes=("/dev/nvidia1", "/dev/nvidiactl"),
        driver_libraries={"libnvidia-ptxjitcompiler.so.1": "/usr/lib/ptx.so.550"},
        isolation_env={
            "GPUPOOL_CUDA_REGION": "/var/lib/gpupool/regions/ab.region",
            "GPUPOOL_REAL_LIBCUDA": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54",
            "LD_LIBRARY_PATH": "/var/cache/gpupool/shim/facade",
            "GPUPOOL_SHIM_PACE": "1",
        },
        visible_devices="GPU-1",
    )
    edits = slice_edits(inputs)
    env = edits.env_map()
    assert env["LD_LIBRARY_PATH"] == f"{SHIM_DIR}:{DRIVER_DIR}"  # the façade first
    assert env["GPUPOOL_CUDA_REGION"] == REGION_PATH
    assert env["GPUPOOL_REAL_LIBCUDA"] == f"{DRIVER_DIR}/libcuda.so.1"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
    assert env["GPUPOOL_SHIM_PACE"] == "1"  # the mode's other variables as they are
    mounts = {m.container_path: (m.host_path, m.options[0]) for m in edits.mounts}
    assert mounts == {
        SHIM_DIR: ("/var/cache/gpupool/shim/facade", "ro"),
        REGION_PATH: ("/var/lib/gpupool/regions/ab.region", "rw"),
        f"{DRIVER_DIR}/libcuda.so.1": ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54", "ro"),
        f"{DRIVER_DIR}/libnvidia-ptxjitcompiler.so.1": ("/usr/lib/ptx.so.550", "ro"),
    }
    assert [d.path for d in edits.device_nodes] == ["/dev/nvidia1", "/dev/nvidiactl"]
    # The value round-trips through the CDI form the engines (and, later, the kubelet) read.
    spec = cdi_spec("a1", edits)
    assert spec["kind"] == CDI_KIND
    assert spec["devices"][0]["name"] == "a1"
    again = json.loads(json.dumps(spec))["devices"][0]["containerEdits"]
    assert ContainerEdits.from_cdi(again) == edits


def test_a_cpu_only_replica_gets_nothing_of_the_node() -> None:
    edits = slice_edits(SliceInputs())
    assert edits.mounts == ()
    assert edits.device_nodes == ()
    assert edits.env_map() == {"CUDA_VISIBLE_DEVICES": ""}
    assert cdi_spec("x", ContainerEdits())["devices"][0]["containerEdits"]  # never empty


def test_the_podman_plan_runs_the_job_attached_as_its_account_and_removes_it() -> None:
    plan = ENGINES["podman"].plan(
        ContainerJob(
            name="gpupool-a1",
            image="localhost/img:1",
            argv=("python", "train.py"),
            env_names=("FOO",),
            user=(1000, 1000),
            groups=(1000, 27),
            mounts=(Mount("/data", "/data", True),),
            workdir="/work",
            cdi_device=f"{CDI_KIND}=a1",
        )
    )
    create = plan.prepare[-1]
    assert create[:2] == ["podman", "create"]
    assert create[-3:] == ["localhost/img:1", "python", "train.py"]
    pairs = set(itertools.pairwise(create))
    for flag in (
        ("--user", "1000:1000"),
        ("--device", f"{CDI_KIND}=a1"),
        ("--volume", "/data:/data:ro"),
        ("--workdir", "/work"),
        ("--env", "FOO"),
        ("--pull", "never"),
    ):
        assert flag in pairs, flag
    assert "--group-add=27" in create
    assert plan.argv == ["podman", "start", "--attach", "gpupool-a1"]
    assert plan.cleanup == [["podman", "rm", "--force", "--time", "0", "gpupool-a1"]]


def test_registries_and_the_allowlist() -> None:
    assert image_registry("ubuntu:24.04") == "docker.io"
    assert image_registry("nvcr.io/nvidia/pytorch:24.05-py3") == "nvcr.io"
    assert image_registry("localhost/x:1") == "localhost"
    assert image_registry("registry:5000/x") == "registry:5000"
    assert registry_allowed("anything/x", [])
    assert registry_allowed("a.corp.io/x", ["*.corp.io"])
    assert not registry_allowed("corp.io.evil.com/x", ["*.corp.io"])
    assert not registry_allowed("ubuntu", ["nvcr.io"])


def test_a_job_file_container_section_is_checked_with_line_numbers() -> None:
    spec = parse_job_yaml(
        "name: t\ncommand: [python]\ncontainer:\n  image: nvcr.io/nvidia/pytorch:24.05-py3\n"
        "  mounts: [/data:/data:ro]\n  env: {A: '1'}\n  workdir: /w\n"
    )
    assert spec.container is not None
    assert spec.container.mounts == (Mount("/data", "/data", True),)
    with pytest.raises(SpecError) as err:
        build_spec({"name": "t", "command": ["x"], "container": {"mounts": "/a:/b", "imag": "x"}})
    text = str(err.value)
    assert "container.image: missing" in text
    assert "container.imag: unknown key" in text


def test_submit_help_lists_the_container_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpupool.cli", "submit", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    for option in ("--image", "--container-mounts", "--container-workdir", "--container-env"):
        assert option in done.stdout


def test_the_sdk_and_allocate_take_the_container_options() -> None:
    spec = options_to_spec(
        {
            "name": "t",
            "command": ["python"],
            "image": "localhost/x:1",
            "container_mounts": ["/data:/data:ro"],
            "container_workdir": "/w",
            "container_env": {"A": "1"},
        }
    )
    built = build_spec(spec)
    assert built.container is not None
    assert (built.container.image, built.container.workdir) == ("localhost/x:1", "/w")
    assert dict(built.container.env) == {"A": "1"}
