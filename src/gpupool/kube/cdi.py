"""A prepared claim as a CDI device: the same container edits as gpupool's own container jobs.

The container runtime (containerd, CRI-O; podman by hand) applies a CDI device's
``containerEdits`` to each container that uses the claim. Those edits are
:func:`gpupool.containers.cdi.slice_edits`' — the one value every engine consumes: the claim's
GPU device nodes, the driver's libraries under ``/usr/local/gpupool/driver``, the shim's façade
first on ``LD_LIBRARY_PATH`` (``/usr/local/gpupool/shim``), the claim's region at
``/run/gpupool/region`` and the shim's environment; so a pod sees the same layout under DRA as a
gpupool container job. This module only names the claim's device (kind
``gpu.gpupool.io/claim``, one device per claim named by its UID) and writes its spec.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpupool.containers.cdi import (
    ContainerEdits,
    SliceInputs,
    cdi_json,
    driver_libraries,
    gpu_device_nodes,
    slice_edits,
)

CDI_KIND = "gpu.gpupool.io/claim"


def loader_cache() -> str:
    """``ldconfig -p``: the libraries the node's dynamic loader knows (the driver's among them)."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        return subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    return ""


def claim_edits(
    shim_env: Mapping[str, str],
    *,
    visible_devices: Sequence[str],
    minors: Sequence[int],
    dev: Path = Path("/dev"),
    ldcache: str | None = None,
) -> ContainerEdits:
    """The edits of a claim: its GPUs' UUIDs and device minors, and the shim's job environment
    in host paths (``runtime.shim.job_env``)."""
    existing = frozenset(f"/dev/{p.name}" for p in dev.glob("nvidia*"))
    libraries = driver_libraries(loader_cache() if ldcache is None else ldcache)
    return slice_edits(
        SliceInputs(
            device_nodes=gpu_device_nodes(list(minors), existing),
            driver_libraries=libraries,
            isolation_env=shim_env,
            visible_devices=",".join(visible_devices),
        )
    )


def cdi_device_id(name: str, kind: str = CDI_KIND) -> str:
    return f"{kind}={name}"


def write_spec(folder: Path, name: str, edits: ContainerEdits, kind: str = CDI_KIND) -> Path:
    """Writes the one-device spec ``name`` atomically as ``gpupool-<name>.json``, readable by
    root only (the engine): it names the claim's region."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"gpupool-{name}.json"
    tmp = target.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(cdi_json(name, edits, kind=kind))
    os.replace(tmp, target)
    return target
