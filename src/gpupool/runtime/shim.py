"""The agent's side of the CUDA shim: one budget region per replica.

A *region* is a pair of files the agent creates before it launches a replica's processes (see
``gpupool/shim/csrc/gp_region.h`` for its layout): the *limits* part ``<region>.limits``, the
agent's alone to write (a job maps it read-only, so it cannot raise its own limit), and the
*usage* part, the file ``GPUPOOL_CUDA_REGION`` names, where the job's processes keep their
usage slots. It holds, per device UUID, the slice's memory
limit (bytes), SM share (permille, 1000 = no cap), context reserve (bytes charged per process
that opens a context there) and spill flag, and one usage slot per attached process. The shim
in each process reads the limits on every allocation and launch, so :meth:`Region.set_limit`
and :meth:`Region.set_share` resize a running slice in place.

Words: *attached* processes are the live ones holding a slot (a job that escaped the shim, e.g.
a static binary or a cleared environment, has none: :attr:`RegionSnapshot.attached` is false);
*reaping* releases the usage of slots whose process is gone; *spilled* bytes are those served
from managed memory because the GPU itself was full (only where spill is on); *lent* SM time is
the spare share the agent gives a replica on top of its own while the device is otherwise idle
(only where the region was created with ``lend_idle``).

All reads and writes go through ``libgpupool_region.so`` (built with the shim), so the layout
has one definition: the C header.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

from gpupool.domain.errors import GpupoolError
from gpupool.runtime.slicectx import SliceContext
from gpupool.shim.build import ShimBuild, ShimBuildError, ensure_built
from gpupool.shim.locate import real_driver, real_nvml

__all__ = [  # real_driver and real_nvml live in gpupool.shim.locate; the agent takes them here
    "DEV_SPILL", "LABEL_LEN", "LIMITS_MODE", "MAX_DEVICES", "MAX_SLOTS", "MIB", "NO_CAP_PERMILLE",
    "REGIONS_FOLDER_MODE", "REGION_LEND_IDLE", "DeviceSlice", "DeviceUsage", "Region",
    "RegionError", "RegionSnapshot", "ShimIsolation", "job_env", "limits_path", "real_driver",
    "real_nvml", "regions_dir", "uuid_bytes", "uuid_text",
]  # fmt: skip

MAX_DEVICES = 16
MAX_SLOTS = 1024  # gp_region.h: processes using CUDA at once (claimed at first use)
LABEL_LEN = 64
DEV_SPILL = 0x1
REGION_LEND_IDLE = 0x1
NO_CAP_PERMILLE = 1000
MIB = 1 << 20
#: The regions folder: others may pass to a region handed to them, not list the folder.
REGIONS_FOLDER_MODE = 0o711
#: The limits part: the agent's to write, every account's to read (a job maps it read-only).
LIMITS_MODE = 0o644


def limits_path(region: Path) -> Path:
    """The region's limits part, beside it: ``<region>.limits`` (see ``gp_region.h``)."""
    return region.with_name(region.name + ".limits")


class RegionError(GpupoolError):
    """A region could not be created, opened or changed (the message says what to do)."""


class _Usage(ctypes.Structure):
    _fields_ = [
        ("uuid", ctypes.c_uint8 * 16),
        ("mem_limit", ctypes.c_uint64),
        ("context_reserve", ctypes.c_uint64),
        ("used", ctypes.c_uint64),
        ("spilled", ctypes.c_uint64),
        ("busy_ns", ctypes.c_uint64),
        ("launches", ctypes.c_uint64),
        ("sm_share", ctypes.c_uint32),
        ("sm_spare", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("pad0", ctypes.c_uint32),
    ]


def uuid_bytes(text: str) -> bytes:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (or ``MIG-...``) as the driver's 16 bytes."""
    body = text.split("-", 1)[1] if text[:4] in ("GPU-", "MIG-") else text
    hexdigits = body.replace("-", "")
    try:
        raw = bytes.fromhex(hexdigits)
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise RegionError(
            f"{text!r} is not a GPU UUID: use the form GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx "
            "(as `nvidia-smi -L` prints it)"
        )
    return raw


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(frozen=True)
class DeviceSlice:
    """What a replica may use of one device. ``sm_share_permille`` 1000 means no compute cap."""

    uuid: str
    mem_limit_bytes: int
    sm_share_permille: int = NO_CAP_PERMILLE
    context_reserve_bytes: int = 0
    spill: bool = False


@dataclass(frozen=True)
class DeviceUsage:
    """One device's totals over the replica's live processes, as the region holds them."""

    uuid: str
    mem_limit_bytes: int
    used_bytes: int
    spilled_bytes: int
    busy_ns: int
    launches: int
    sm_share_permille: int
    sm_spare_permille: int
    context_reserve_bytes: int
    spill: bool


@dataclass(frozen=True)
class RegionSnapshot:
    """One read of a region: usage per device and the pids of the processes attached to it."""

    devices: tuple[DeviceUsage, ...]
    attached_pids: tuple[int, ...]

    @property
    def attached(self) -> bool:
        """Whether any live process of the replica runs under the shim."""
        return bool(self.attached_pids)

    def device(self, uuid: str) -> DeviceUsage:
        for d in self.devices:
            if d.uuid == uuid_text(uuid_bytes(uuid)):
                return d
        raise RegionError(f"device {uuid} is not part of this slice")


def _lib(build: ShimBuild | None) -> ctypes.CDLL:
    lib = ctypes.CDLL(str((build or ensure_built()).region_lib))
    vp, u32, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
    lib.gp_region_create.argtypes = [
        ctypes.c_char_p, ctypes.c_char_p, u32, ctypes.c_char_p,
        ctypes.POINTER(u64), ctypes.POINTER(u32), ctypes.POINTER(u64), u32, u32,
    ]  # fmt: skip
    lib.gp_region_create.restype = ctypes.c_int
    lib.gp_region_map.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    lib.gp_region_map.restype = vp
    lib.gp_region_unmap.argtypes = [vp]
    lib.gp_region_unmap.restype = None
    for name, arg in (("limit", u64), ("share", u32), ("spare", u32), ("dev_flags", u32)):
        fn = getattr(lib, f"gp_region_set_{name}")
        fn.argtypes = [vp, u32, arg]
        fn.restype = ctypes.c_int
    lib.gp_region_reap.argtypes = [vp]
    lib.gp_region_reap.restype = ctypes.c_int
    lib.gp_region_usage.argtypes = [vp, ctypes.POINTER(_Usage), u32]
    lib.gp_region_usage.restype = ctypes.c_int
    lib.gp_region_attached.argtypes = [vp, ctypes.POINTER(ctypes.c_int32), u32]
    lib.gp_region_attached.restype = ctypes.c_int
    return lib


class Region:
    """A mapped region. Create one with :meth:`create` (the agent, before launch) or map an
    existing one with :meth:`open`; :meth:`close` unmaps it (the file stays)."""

    def __init__(self, path: Path, lib: ctypes.CDLL, handle: int) -> None:
        self.path = path
        self._lib = lib
        self._handle: int | None = handle
        self._uuids = tuple(d.uuid for d in self.read().devices)

    @classmethod
    def create(
        cls,
        path: Path,
        label: str,
        devices: Sequence[DeviceSlice],
        *,
        lend_idle: bool = False,
        build: ShimBuild | None = None,
    ) -> Region:
        if not devices or len(devices) > MAX_DEVICES:
            raise RegionError(f"a slice has 1 to {MAX_DEVICES} devices, not {len(devices)}")
        for d in devices:
            _check_limits(d.mem_limit_bytes, d.sm_share_permille)
            if d.context_reserve_bytes < 0:
                raise RegionError(f"context reserve {d.context_reserve_bytes} is negative")
        raw = b"".join(uuid_bytes(d.uuid) for d in devices)
        if len({raw[i : i + 16] for i in range(0, len(raw), 16)}) != len(devices):
            raise RegionError("a device appears twice in the slice: list each UUID once")
        n = len(devices)
        lib = _lib(build)
        limits = (ctypes.c_uint64 * n)(*(d.mem_limit_bytes for d in devices))
        shares = (ctypes.c_uint32 * n)(*(d.sm_share_permille for d in devices))
        reserves = (ctypes.c_uint64 * n)(*(d.context_reserve_bytes for d in devices))
        rc = lib.gp_region_create(
            str(path).encode(), label.encode()[: LABEL_LEN - 1], n, raw, limits, shares, reserves,
            0, REGION_LEND_IDLE if lend_idle else 0,
        )  # fmt: skip
        if rc != 0:
            raise RegionError(f"cannot create the slice region {path}: {os.strerror(-rc)}")
        region = cls.open(path, build=build)
        for d in devices:
            if d.spill:
                region.set_spill(d.uuid, True)
        return region

    @classmethod
    def open(cls, path: Path, *, build: ShimBuild | None = None) -> Region:
        lib = _lib(build)
        err = ctypes.c_int(0)
        handle = lib.gp_region_map(str(path).encode(), ctypes.byref(err))
        if not handle:
            why = (
                "not a slice region of this version"
                if err.value == -71
                else os.strerror(-err.value)
            )
            raise RegionError(f"cannot open the slice region {path}: {why}")
        return cls(path, lib, handle)

    def close(self) -> None:
        if self._handle is not None:
            self._lib.gp_region_unmap(self._handle)
            self._handle = None

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _h(self) -> int:
        if self._handle is None:
            raise RegionError(f"the region {self.path} is closed")
        return self._handle

    def _index(self, uuid: str) -> int:
        want = uuid_text(uuid_bytes(uuid))
        for i, u in enumerate(self._uuids):
            if u == want:
                return i
        raise RegionError(
            f"device {uuid} is not part of this slice: it has {', '.join(self._uuids)}"
        )

    def read(self) -> RegionSnapshot:
        out = (_Usage * MAX_DEVICES)()
        n = self._lib.gp_region_usage(self._h(), out, MAX_DEVICES)
        pids = (ctypes.c_int32 * MAX_SLOTS)()
        k = self._lib.gp_region_attached(self._h(), pids, MAX_SLOTS)
        devices = tuple(
            DeviceUsage(
                uuid=uuid_text(bytes(u.uuid)),
                mem_limit_bytes=u.mem_limit,
                used_bytes=u.used,
                spilled_bytes=u.spilled,
                busy_ns=u.busy_ns,
                launches=u.launches,
                sm_share_permille=u.sm_share,
                sm_spare_permille=u.sm_spare,
                context_reserve_bytes=u.context_reserve,
                spill=bool(u.flags & DEV_SPILL),
            )
            for u in out[:n]
        )
        return RegionSnapshot(devices=devices, attached_pids=tuple(pids[:k]))

    def set_limit(self, uuid: str, mem_limit_bytes: int) -> None:
        """Resize the slice's memory on one device, seen by running processes at their next
        allocation. A limit under current usage refuses new allocations; nothing is taken back."""
        _check_limits(mem_limit_bytes, NO_CAP_PERMILLE)
        self._lib.gp_region_set_limit(self._h(), self._index(uuid), mem_limit_bytes)

    def set_share(self, uuid: str, sm_share_permille: int) -> None:
        """Change the SM share (permille, 1000 = no cap), seen at the next launch."""
        _check_limits(0, sm_share_permille)
        self._lib.gp_region_set_share(self._h(), self._index(uuid), sm_share_permille)

    def set_spare(self, uuid: str, sm_spare_permille: int) -> None:
        """Lend idle SM time on top of the share (used only where the region lends idle time)."""
        if not 0 <= sm_spare_permille <= NO_CAP_PERMILLE:
            raise RegionError(f"a spare share is 0 to 1000 permille, not {sm_spare_permille}")
        self._lib.gp_region_set_spare(self._h(), self._index(uuid), sm_spare_permille)

    def set_spill(self, uuid: str, on: bool) -> None:
        self._lib.gp_region_set_dev_flags(self._h(), self._index(uuid), DEV_SPILL if on else 0)

    def reap(self) -> int:
        """Release the usage of processes that are gone; returns how many slots were freed."""
        n = int(self._lib.gp_region_reap(self._h()))
        if n < 0:
            raise RegionError(f"cannot lock the region {self.path}")
        return n


def _check_limits(mem_limit_bytes: int, sm_share_permille: int) -> None:
    if mem_limit_bytes < 0 or mem_limit_bytes >= 1 << 64:
        raise RegionError(f"memory limit {mem_limit_bytes} bytes is out of range")
    if not 1 <= sm_share_permille <= NO_CAP_PERMILLE:
        raise RegionError(
            f"SM share {sm_share_permille} permille is out of range: use 1 to 1000 (1000: no cap)"
        )


def job_env(
    region_path: Path,
    real_driver: Path,
    *,
    real_nvml: Path | None = None,
    build: ShimBuild | None = None,
    preload: bool = False,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment a replica's processes need to run under the shim: the façade first on
    ``LD_LIBRARY_PATH`` (or, with ``preload``, the fallback in ``LD_PRELOAD``), the region and
    the real driver's path (and the real NVML's, for the NVML façade beside it)."""
    b = build or ensure_built()
    env = dict(base or {})
    env["GPUPOOL_CUDA_REGION"] = str(region_path)
    env["GPUPOOL_REAL_LIBCUDA"] = str(real_driver)
    if real_nvml is not None:
        env["GPUPOOL_REAL_LIBNVML"] = str(real_nvml)
    if preload:
        env["LD_PRELOAD"] = ":".join(p for p in (str(b.preload), env.get("LD_PRELOAD")) if p)
    else:
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(b.facade_dir), old) if p)
    return env


def regions_dir() -> Path:
    """Where :class:`ShimIsolation` creates regions: ``$GPUPOOL_SHIM_REGIONS``, else
    ``/dev/shm/gpupool-regions`` (memory-backed), else the temporary folder."""
    explicit = os.environ.get("GPUPOOL_SHIM_REGIONS")
    if explicit:
        return Path(explicit)
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() else Path(tempfile.gettempdir())
    return base / f"gpupool-regions-{os.getuid()}"


class ShimIsolation:
    """Isolation mode ``shim``: gpupool's CUDA driver shim holds each process of the replica to
    the slice (memory limit per device, SM share as a launch-pacing cap), for any CUDA program.

    It needs the shim built (a C compiler on the node, once) and a real driver; it refuses MIG
    instances (the hardware isolates them already). :meth:`job_env` creates the replica's region
    before launch and names it, the façade and the real driver in the job's environment; the
    region's path is ``GPUPOOL_CUDA_REGION`` in that environment.
    """

    name = "shim"

    def supports(self, ctx: SliceContext) -> str | None:
        if any(d.is_mig for d in ctx.devices):
            return "the CUDA shim does not run on MIG instances (MIG isolates them already)"
        return self.unavailable()

    @staticmethod
    def unavailable() -> str | None:
        """Why this node cannot run the shim at all (no real driver, no build), else ``None``:
        what the agent asks at start to decide whether it offers the mode."""
        if real_driver() is None:
            return (
                "no CUDA driver (libcuda.so.1) found on this node: install the NVIDIA driver or "
                "set GPUPOOL_REAL_LIBCUDA to its path"
            )
        try:
            ensure_built()
        except ShimBuildError as exc:
            return str(exc)
        return None

    @staticmethod
    def region_path(env: Mapping[str, str]) -> Path | None:
        """The region a replica's environment names (``None`` for a replica not under the shim):
        what the agent reads for usage and attachment while it runs."""
        value = env.get("GPUPOOL_CUDA_REGION")
        return Path(value) if value else None

    @staticmethod
    def release(env: Mapping[str, str]) -> None:
        """Delete the replica's region (both parts) once its processes are gone (the agent, at
        replica end)."""
        path = ShimIsolation.region_path(env)
        if path is not None:
            path.unlink(missing_ok=True)
            limits_path(path).unlink(missing_ok=True)

    def job_env(self, ctx: SliceContext, *, pace: bool = True) -> dict[str, str]:
        """``pace=False`` leaves compute alone (share 1000): under ``mps+shim`` MPS does it."""
        driver = real_driver()
        if driver is None:  # supports() said so first; the node changed since
            raise RegionError("the CUDA driver is gone from this node")
        folder = regions_dir()
        folder.mkdir(parents=True, exist_ok=True)
        # Jobs of other accounts pass through to their own region (handed to them, see
        # hand_over); none can list the folder, and a region's name is unguessable.
        folder.chmod(REGIONS_FOLDER_MODE)
        path = folder / f"{uuid4().hex}.region"
        slices = [
            DeviceSlice(
                uuid=d.uuid,
                mem_limit_bytes=ctx.memory_mib * MIB,
                sm_share_permille=min(NO_CAP_PERMILLE, max(1, ctx.milli))
                if pace
                else NO_CAP_PERMILLE,
                context_reserve_bytes=ctx.shim_reserve_bytes.get(d.uuid, 0),
                spill=ctx.spill,
            )
            for d in ctx.devices
        ]
        label = f"{ctx.milli}m of {len(ctx.devices)} GPU(s), {ctx.memory_mib} MiB each"
        Region.create(path, label, slices).close()
        # LD_LIBRARY_PATH is the façade's folder alone: agent/env.py puts it in front of the
        # job's own path.
        return job_env(path, driver, real_nvml=real_nvml())

    @staticmethod
    def hand_over(env: Mapping[str, str], uid: int, gid: int) -> None:
        """Give the replica's usage part to the account its processes run as (``--run-as``):
        they map it read-write to claim their slots. It stays ``0600``: no other account may
        read or write it. The limits part stays the agent's (``0644``): the job maps it
        read-only and cannot open it for writing."""
        path = ShimIsolation.region_path(env)
        if path is not None:
            os.chown(path, uid, gid)
            path.chmod(0o600)
            limits_path(path).chmod(LIMITS_MODE)
