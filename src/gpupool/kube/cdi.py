"""A prepared claim as a CDI spec: the container edits that put the shim in front of the driver.

The container runtime (containerd, CRI-O; podman by hand) applies a CDI device's
``containerEdits`` to each container that uses the claim: the GPU device nodes, the real driver
library and the shim's façade bind-mounted at fixed paths, the façade first on
``LD_LIBRARY_PATH``, the claim's region mounted read-write, and the environment the shim reads.

Paths inside the container are those of the containers issue's ``gpupool.containers.cdi``
(``/usr/local/gpupool/shim``, ``/usr/local/gpupool/driver``, ``/run/gpupool/region``), so a
job sees the same layout under DRA as under gpupool's own container jobs. This module is the
kubelet plugin's minimal local version of that value, written before that one landed: the two
are to be unified into one (the lead's note in docs/kubernetes.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

CDI_VERSION = "0.5.0"
CDI_KIND = "gpu.gpupool.io/claim"
SHIM_DIR = "/usr/local/gpupool/shim"
DRIVER_DIR = "/usr/local/gpupool/driver"
REGION_PATH = "/run/gpupool/region"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def _mount(host: str, inside: str, *, writable: bool = False) -> dict[str, Any]:
    mode = "rw" if writable else "ro"
    return {"hostPath": host, "containerPath": inside, "options": [mode, "nosuid", "nodev", "bind"]}


def claim_edits(
    shim_env: Mapping[str, str], *, visible_devices: Sequence[str], device_nodes: Sequence[str]
) -> dict[str, Any]:
    """CDI ``containerEdits`` from the shim's job environment (host paths, from
    ``runtime.shim.job_env``), the claim's GPU UUIDs and the device nodes that exist."""
    env = dict(shim_env)
    mounts: list[dict[str, Any]] = []
    for var, soname in (
        ("GPUPOOL_REAL_LIBCUDA", "libcuda.so.1"),
        ("GPUPOOL_REAL_LIBNVML", "libnvidia-ml.so.1"),
    ):
        if env.get(var):
            inside = f"{DRIVER_DIR}/{soname}"
            mounts.append(_mount(env[var], inside))
            env[var] = inside
    region = env.get("GPUPOOL_CUDA_REGION")
    if region:
        mounts.append(_mount(region, REGION_PATH, writable=True))
        env["GPUPOOL_CUDA_REGION"] = REGION_PATH
    facade = [p for p in env.pop("LD_LIBRARY_PATH", "").split(":") if p]
    path = []
    if facade:
        mounts.append(_mount(facade[0], SHIM_DIR))
        path.append(SHIM_DIR)
    if any(m["containerPath"].startswith(DRIVER_DIR) for m in mounts):
        path.append(DRIVER_DIR)
    if path:
        env["LD_LIBRARY_PATH"] = ":".join(path)
    preload = env.get("LD_PRELOAD")
    if preload:
        first = preload.split(":")[0]
        inside = f"{SHIM_DIR}/{PurePosixPath(first).name}"
        mounts.append(_mount(first, inside))
        env["LD_PRELOAD"] = inside
    env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_devices)
    edits: dict[str, Any] = {
        "env": [f"{k}={v}" for k, v in sorted(env.items())],
        "mounts": mounts,
    }
    if device_nodes:
        edits["deviceNodes"] = [{"path": p} for p in device_nodes]
    return edits


def device_nodes(minors: Sequence[int], dev: Path = Path("/dev")) -> tuple[str, ...]:
    """``/dev/nvidiaN`` of these GPUs and the control nodes, those that exist on the node."""
    wanted = [f"/dev/nvidia{m}" for m in sorted(set(minors))] + list(CONTROL_NODES)
    return tuple(p for p in wanted if (dev / PurePosixPath(p).name).exists())


def cdi_device_id(name: str, kind: str = CDI_KIND) -> str:
    return f"{kind}={name}"


def write_spec(folder: Path, name: str, edits: Mapping[str, Any], kind: str = CDI_KIND) -> Path:
    """Writes the one-device spec ``name`` atomically as ``gpupool-<name>.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [{"name": name, "containerEdits": dict(edits)}],
    }
    target = folder / f"gpupool-{name}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, target)
    return target
