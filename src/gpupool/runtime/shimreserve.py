"""The CUDA shim's context reserve: the device memory a process's first context takes, measured.

A CUDA context holds device memory the job never asked for (module images, the local-memory
pool, printf and malloc heaps: hundreds of MiB on Hopper). The shim charges it to the slice once
per process and device (the region's ``context_reserve``), so what a job can allocate is
``limit - reserve`` per process, as it would be on a GPU of the slice's size.

**Measured** (:func:`measure`): a short child process opens the node's *real* driver by its path
(never the shim's façade), ``cuInit``, makes the primary context of one device current, and asks
NVML (the real ``libnvidia-ml``) for its *own* process's memory on that device: what this
context took, whatever else runs on the GPU. Where NVML cannot say (no NVML, no per-process
figures, a PID namespace hiding the child's host pid) it reads ``cuMemGetInfo`` instead:
``total - free``, which counts whatever else holds memory there then (hence the plausibility
bound below). One device of each model is measured, before the
agent starts any job there; the figure is kept per model and driver version in the agent's state
folder (``shim-context.json``), so a restarted agent, whose adopted jobs may hold memory, reads
it instead of measuring again.

**When measuring fails** (no driver, the child fails or hangs past ``timeout_s``, or the device
shows more in use than a context could take: :data:`MAX_PLAUSIBLE_FRACTION` of the device, a
sign that something else holds memory there) the reserve is the estimate
:data:`ESTIMATE_BYTES` (conservative: a Hopper context is ~500 MiB); the agent logs a warning
naming the model, the reason and the estimate, and nothing is cached, so the next start tries
again.

Words: a *model key* is ``"NAME / driver VERSION"`` as the driver reports them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpupool.shim.locate import real_nvml

log = logging.getLogger("gpupool.agent")

#: The reserve assumed where it could not be measured (bytes).
ESTIMATE_BYTES = 512 << 20
#: A first context taking more than this share of a device means something else holds memory.
MAX_PLAUSIBLE_FRACTION = 0.25
CACHE_NAME = "shim-context.json"

# Run with the real driver's path as argv[1] and CUDA_VISIBLE_DEVICES set. "names": one line per
# visible device (uuid, name), no context. "measure": the first device's context cost.
_CHILD = r"""
import ctypes, json, os, sys
cuda = ctypes.CDLL(sys.argv[1])
def ok(rc, what):
    if rc != 0:
        print(json.dumps({"error": f"{what} returned CUDA error {rc}"}), flush=True)
        sys.exit(0)
ok(cuda.cuInit(0), "cuInit")
version = ctypes.c_int()
ok(cuda.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
count = ctypes.c_int()
ok(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
out = {"driver": version.value, "devices": []}
for i in range(count.value if sys.argv[2] == "names" else min(1, count.value)):
    dev, name, uuid = ctypes.c_int(), ctypes.create_string_buffer(256), (ctypes.c_ubyte * 16)()
    ok(cuda.cuDeviceGet(ctypes.byref(dev), i), "cuDeviceGet")
    ok(cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
    get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
    ok(get_uuid(uuid, dev), "cuDeviceGetUuid")
    h = bytes(uuid).hex()
    entry = {"uuid": f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}",
             "name": name.value.decode(errors="replace")}
    if sys.argv[2] == "measure":
        ctx, free, total = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
        ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        ok(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        entry["free"], entry["total"] = free.value, total.value
        try:  # this process's own use, as NVML sees it
            import pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByUUID(entry["uuid"])
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.pid == os.getpid() and p.usedGpuMemory is not None:
                    entry["own"] = int(p.usedGpuMemory)
        except Exception as exc:
            entry["nvml"] = str(exc)
    out["devices"].append(entry)
print(json.dumps(out), flush=True)
"""


class MeasureError(Exception):
    """The context reserve could not be measured (the message says why)."""


@dataclass(frozen=True)
class DeviceModel:
    uuid: str
    key: str  # "NAME / driver VERSION"


def _run(
    driver: Path, uuids: Iterable[str], what: str, timeout_s: float, nvml: Path | None = None
) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_CUDA_")}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    if nvml is not None:  # pynvml loads libnvidia-ml.so.1 by name: the real one first
        first = (str(nvml.parent), env.get("LD_LIBRARY_PATH"))
        env["LD_LIBRARY_PATH"] = ":".join(p for p in first if p)
    env.pop("LD_PRELOAD", None)  # the real driver, not the shim
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(driver), what],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise MeasureError(f"the CUDA child did not answer within {timeout_s:.0f}s") from None
    except OSError as exc:
        raise MeasureError(f"the CUDA child could not start: {exc}") from None
    lines = proc.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise MeasureError(f"the CUDA child failed: {tail[0]}")
    if "error" in answer:
        raise MeasureError(str(answer["error"]))
    return answer


def models(driver: Path, uuids: Iterable[str], timeout_s: float = 60.0) -> list[DeviceModel]:
    """The model key of each device, as the driver names it (no context is made)."""
    answer = _run(driver, uuids, "names", timeout_s)
    version = answer["driver"]
    devices = answer["devices"]
    assert isinstance(devices, list)
    return [DeviceModel(str(d["uuid"]), f"{d['name']} / driver {version}") for d in devices]


def measure(driver: Path, uuid: str, timeout_s: float = 60.0, nvml: Path | None = None) -> int:
    """Bytes a process's first context takes on device ``uuid`` (raises :class:`MeasureError`):
    NVML's figure for the measuring process where NVML gives one, else ``total - free``."""
    answer = _run(driver, [uuid], "measure", timeout_s, nvml)
    devices = answer["devices"]
    assert isinstance(devices, list)
    if not devices:
        raise MeasureError(f"the driver does not list device {uuid}")
    own = devices[0].get("own")
    total, free = int(devices[0]["total"]), int(devices[0]["free"])
    taken = own if isinstance(own, int) and own > 0 else total - free
    if taken < 0 or taken > total * MAX_PLAUSIBLE_FRACTION:
        whose = "this process holds" if taken == own else "in use"
        raise MeasureError(
            f"{taken} of {total} bytes {whose} after a bare context: more than a context could "
            "take (something else holds memory on the device)"
        )
    return taken


class ShimReserves:
    """Context reserve per device: measured once per model and driver version, kept in
    ``path`` (the agent's ``state_dir / shim-context.json``), else :data:`ESTIMATE_BYTES`."""

    def __init__(
        self, path: Path, driver: Path, timeout_s: float = 60.0, nvml: Path | None = None
    ) -> None:
        self._path = path
        self._driver = driver
        self._nvml = nvml if nvml is not None else real_nvml()
        self._timeout_s = timeout_s
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        self.known: dict[str, int] = {
            k: v for k, v in known.items() if isinstance(k, str) and isinstance(v, int)
        }

    def for_devices(self, uuids: Iterable[str]) -> dict[str, int]:
        """The reserve of each device (bytes), measuring each model not yet known."""
        wanted = list(uuids)
        if not wanted:
            return {}
        try:
            found = models(self._driver, wanted, self._timeout_s)
        except MeasureError as exc:
            log.warning(
                "CUDA shim: cannot read this node's GPU models (%s): a context reserve of %d MiB "
                "is assumed on every GPU",
                exc,
                ESTIMATE_BYTES >> 20,
            )
            return dict.fromkeys(wanted, ESTIMATE_BYTES)
        out: dict[str, int] = {}
        changed = False
        failed: dict[str, str] = {}
        for m in found:
            if m.key not in self.known and m.key not in failed:
                try:
                    self.known[m.key] = measure(self._driver, m.uuid, self._timeout_s, self._nvml)
                    changed = True
                    log.info("CUDA shim: a context takes %d bytes on %s", self.known[m.key], m.key)
                except MeasureError as exc:
                    failed[m.key] = str(exc)
                    log.warning(
                        "CUDA shim: cannot measure the context reserve of %s (%s): %d MiB "
                        "assumed until the agent's next start",
                        m.key,
                        exc,
                        ESTIMATE_BYTES >> 20,
                    )
            out[m.uuid] = self.known.get(m.key, ESTIMATE_BYTES)
        if changed:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._path.write_text(json.dumps(self.known, indent=1, sort_keys=True))
        for u in wanted:  # a device the driver did not list
            out.setdefault(u, ESTIMATE_BYTES)
        return out
