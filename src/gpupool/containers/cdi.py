"""A replica's slice as CDI container edits: the one value every container runtime consumes.

The Container Device Interface (CDI, ``github.com/cncf-tags/container-device-interface``) is a
JSON/YAML file naming devices of a *kind* (``vendor/class``) and, for each device, the
*container edits* that make it usable inside a container: device nodes, bind mounts,
environment variables and OCI hooks. podman (4.1+) and docker (25+) read spec files from
``/etc/cdi`` and ``/var/run/cdi`` and apply a device's edits for ``--device KIND=NAME``; the
Kubernetes kubelet plugin (a later issue) hands the same edits to containerd or CRI-O.

:func:`slice_edits` is pure: a replica's :class:`SliceInputs` (what the node decided for it:
device nodes, the driver's user-space libraries, gpupool's shim façade, the replica's region
file, its isolation environment, the MPS pipe folder) in, :class:`ContainerEdits` out. Nothing
else of the node goes in: only the assigned GPUs' ``/dev/nvidiaN`` and the control nodes, the
libraries the driver's files name, and gpupool's own pieces.

Where things appear inside the container (fixed, so that a job can rely on them and so that
an image's own libraries never shadow the node's driver, which must match the kernel module):

| inside | what |
|---|---|
| ``/usr/local/gpupool/shim`` | the shim's façade folder, first on ``LD_LIBRARY_PATH`` |
| ``/usr/local/gpupool/driver/<soname>`` | each driver library, next on ``LD_LIBRARY_PATH`` |
| ``/run/gpupool/region`` | the replica's slice region (read and written by the shim) |
| ``/run/gpupool/mps`` | the MPS pipe folder (MPS modes) |
| ``/usr/local/gpupool/softhook`` | the ``soft`` mode's interpreter hook, first on ``PYTHONPATH`` |

Library discovery follows the NVIDIA Container Toolkit's approach (its ``ldcache`` lookup):
the dynamic loader's cache (``ldconfig -p``) lists every library the node's driver installed;
:func:`driver_libraries` keeps those whose soname is one of the driver's user-space libraries
(:data:`DRIVER_LIBRARIES`), never a hard-coded path. No hook is used: the toolkit's
``update-ldcache`` hook is replaced by ``LD_LIBRARY_PATH``, which needs nothing in the image.

Words: a **soname** is a library's versioned file name as the loader asks for it
(``libcuda.so.1``); **host path** is a path on the node, **container path** one inside.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Any

#: The CDI spec version written (podman 4.3's CDI library reads 0.3.0-0.5.0).
CDI_VERSION = "0.5.0"
#: The CDI kind of gpupool slices: one device per replica, named by its assignment id.
CDI_KIND = "gpupool.dev/slice"

SHIM_DIR = "/usr/local/gpupool/shim"
DRIVER_DIR = "/usr/local/gpupool/driver"
SOFTHOOK_DIR = "/usr/local/gpupool/softhook"
REGION_PATH = "/run/gpupool/region"
MPS_DIR = "/run/gpupool/mps"

#: Sonames of the driver's user-space libraries a CUDA program may load (the toolkit's
#: "compute" and "utility" capabilities).
DRIVER_LIBRARIES = (
    "libcuda.so.1",
    "libcudadebugger.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libnvidia-opencl.so.1",
    "libnvidia-cfg.so.1",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so.1",
)
#: Device nodes every GPU container needs besides its ``/dev/nvidiaN``.
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True)
class DeviceNode:
    """A device node made in the container at ``path`` (the host's node of the same path)."""

    path: str
    host_path: str | None = None  # None: the same as path


@dataclass(frozen=True)
class MountEdit:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("ro", "nosuid", "nodev", "bind")


@dataclass(frozen=True)
class Hook:
    """An OCI hook (CDI ``hooks``); none is needed today, kept for the spec's full shape."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerEdits:
    """CDI ``containerEdits``: ``env`` as ``NAME=VALUE`` strings, in a stable order."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[MountEdit, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def env_map(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env)

    def to_cdi(self) -> dict[str, Any]:
        """The CDI JSON form (camelCase keys, empty lists left out)."""
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [
                {"path": d.path, **({"hostPath": d.host_path} if d.host_path else {})}
                for d in self.device_nodes
            ]
        if self.mounts:
            out["mounts"] = [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "options": [*m.options],
                }
                for m in self.mounts
            ]
        if self.hooks:
            out["hooks"] = [
                {"hookName": h.hook_name, "path": h.path, "args": [*h.args], "env": [*h.env]}
                for h in self.hooks
            ]
        return out

    @classmethod
    def from_cdi(cls, data: Mapping[str, Any]) -> ContainerEdits:
        return cls(
            env=tuple(data.get("env", ())),
            device_nodes=tuple(
                DeviceNode(d["path"], d.get("hostPath")) for d in data.get("deviceNodes", ())
            ),
            mounts=tuple(
                MountEdit(m["hostPath"], m["containerPath"], tuple(m.get("options", ())))
                for m in data.get("mounts", ())
            ),
            hooks=tuple(
                Hook(h["hookName"], h["path"], tuple(h.get("args", ())), tuple(h.get("env", ())))
                for h in data.get("hooks", ())
            ),
        )


@dataclass(frozen=True)
class SliceInputs:
    """What the node decided for one replica, in host paths.

    ``device_nodes``: the assigned GPUs' nodes and the control nodes that exist on the node;
    ``driver_libraries``: soname -> host file (see :func:`driver_libraries`);
    ``isolation_env``: the isolation mode's variables as a bare process would get them
    (``gpupool.runtime.isolation.isolation_env``), with host paths that are rewritten here;
    ``visible_devices``: ``CUDA_VISIBLE_DEVICES`` (the slice's device UUIDs).
    """

    device_nodes: tuple[str, ...] = ()
    driver_libraries: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    isolation_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    visible_devices: str = ""


_REAL_LIBRARIES = (
    ("GPUPOOL_REAL_LIBCUDA", "libcuda.so.1"),
    ("GPUPOOL_REAL_LIBNVML", "libnvidia-ml.so.1"),
)


def slice_edits(inputs: SliceInputs) -> ContainerEdits:
    """The container edits that carry ``inputs`` into a container (see the module docstring)."""
    env = dict(inputs.isolation_env)
    mounts: dict[str, MountEdit] = {}  # by container path: each target once

    def mount(host: str, inside: str, *, writable: bool = False) -> str:
        options = ("rw" if writable else "ro", "nosuid", "nodev", "bind")
        mounts.setdefault(inside, MountEdit(host, inside, options))
        return inside

    libs = dict(inputs.driver_libraries)
    # The shim names the real driver by path: that file is the driver inside too.
    for var, soname in (
        ("GPUPOOL_REAL_LIBCUDA", "libcuda.so.1"),
        ("GPUPOOL_REAL_LIBNVML", "libnvidia-ml.so.1"),
    ):
        if var in env:
            libs[soname] = env[var]
            env[var] = f"{DRIVER_DIR}/{soname}"
    for soname, host in sorted(libs.items()):
        mount(host, f"{DRIVER_DIR}/{soname}")
    region = env.get("GPUPOOL_CUDA_REGION")
    if region:
        env["GPUPOOL_CUDA_REGION"] = mount(region, REGION_PATH, writable=True)
    library_path = [DRIVER_DIR] if libs else []
    shim_dirs = [p for p in env.pop("LD_LIBRARY_PATH", "").split(":") if p]
    if shim_dirs:  # the façade's folder, first
        library_path.insert(0, mount(shim_dirs[0], SHIM_DIR))
    if library_path:
        env["LD_LIBRARY_PATH"] = ":".join(library_path)
    preload = env.get("LD_PRELOAD")
    if preload:
        name = PurePosixPath(preload.split(":")[0]).name
        env["LD_PRELOAD"] = mount(preload.split(":")[0], f"{SHIM_DIR}/{name}")
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")
    if pipe:
        env["CUDA_MPS_PIPE_DIRECTORY"] = mount(pipe, MPS_DIR, writable=True)
    env.pop("CUDA_MPS_LOG_DIRECTORY", None)  # the daemon's log stays on the node
    hook = env.get("PYTHONPATH")
    if hook:
        env["PYTHONPATH"] = mount(hook.split(":")[0], SOFTHOOK_DIR)
    env["CUDA_VISIBLE_DEVICES"] = inputs.visible_devices
    return ContainerEdits(
        env=tuple(f"{k}={v}" for k, v in sorted(env.items())),
        device_nodes=tuple(DeviceNode(p) for p in inputs.device_nodes),
        mounts=tuple(mounts[k] for k in sorted(mounts)),
    )


def cdi_spec(name: str, edits: ContainerEdits, *, kind: str = CDI_KIND) -> dict[str, Any]:
    """A CDI spec with one device ``name`` (the replica) carrying ``edits``. The engine is
    asked for it as ``--device KIND=NAME``."""
    cdi_edits = edits.to_cdi() or {"env": ["GPUPOOL_CDI=1"]}  # CDI refuses empty edits
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [{"name": name, "containerEdits": cdi_edits}],
    }


def cdi_json(name: str, edits: ContainerEdits, *, kind: str = CDI_KIND) -> str:
    return json.dumps(cdi_spec(name, edits, kind=kind), indent=2, sort_keys=True) + "\n"


def driver_libraries(ldcache: str, *, wanted: tuple[str, ...] = DRIVER_LIBRARIES) -> dict[str, str]:
    """The driver's libraries in the loader's cache listing (``ldconfig -p`` output):
    soname -> host path, the first (native, 64-bit) entry of each wanted soname."""
    found: dict[str, str] = {}
    for line in ldcache.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if not sep:
            continue
        soname = name.split(" (", 1)[0].strip()
        arch = name.partition("(")[2]
        if soname in wanted and soname not in found and ("x86-64" in arch or "64" in arch):
            found[soname] = path.strip()
    return found


def gpu_device_nodes(minors: list[int], existing: frozenset[str]) -> tuple[str, ...]:
    """The device nodes of GPUs with these minor numbers and the control nodes, keeping those
    in ``existing`` (the node's ``/dev/nvidia*``): a node without a driver has none."""
    wanted = [f"/dev/nvidia{m}" for m in sorted(set(minors))] + list(CONTROL_NODES)
    return tuple(p for p in wanted if p in existing)
