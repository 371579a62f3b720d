"""``python -m gpupool.agent.probe``: what this node's GPUs and driver do with gpupool's code.

Run by ``scripts/gpu-check.sh`` on a machine with an NVIDIA GPU (about a minute). It uses the
project's own code paths (the NVML backend, the context measurement, the isolation
environment, the MPS daemon and its server limits, the agent's attachment check) and prints
one table, a row per check: ``PASS``, ``FAIL``, ``INFO`` (a figure to read) or ``SKIP`` (with
why). The exit code is the number of FAILs (0 = nothing failed).

Checks: driver and binding versions; every NVML call the agent makes and its outcome; v1 vs
v2 memory; NVLink groups vs NVML's P2P status; the CUDA context size against the watchdog's
reserve; MPS (client attached, SM share, memory limit on a device other than the first where
there is one, a job's own override refused, a silent fallback detected); the time from SIGKILL
to NVML releasing a process's memory; XID event support.

CUDA work runs in child processes through the driver API (``libcuda``), so no framework is
needed; a check that needs CUDA is skipped where ``libcuda`` cannot be loaded. Nothing on the
device is reconfigured (no compute mode or MIG change); the MPS daemon it starts is its own
(pipe folder under ``/tmp``) and is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from gpupool.agent import mpsplan
from gpupool.agent.node import nvlink_groups
from gpupool.gpu.base import DeviceInfo, GpuUnavailable
from gpupool.gpu.context import ALLOWANCE_MIB, default_context_mib, measure_context_mib
from gpupool.gpu.nvml import NvmlBackend
from gpupool.runtime.isolation import SliceContext, SliceDevice, isolation_env
from gpupool.runtime.mps import MpsDaemon

PASS, FAIL, INFO, SKIP = "PASS", "FAIL", "INFO", "SKIP"
CUDA_ERROR_OUT_OF_MEMORY = 2

#: A CUDA client without a framework: context, SM count, allocations (MiB, kept), then waits.
CHILD = r"""
import ctypes, sys
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    print(f"nocuda {exc}", flush=True); sys.exit(3)
dev, ctx, sms = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
for what, rc in (("cuInit", lambda: cuda.cuInit(0)),
                 ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(dev), 0)),
                 ("cuCtxCreate", lambda: cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))):
    code = rc()
    if code != 0:
        print(f"error {what} {code}", flush=True); sys.exit(4)
cuda.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev)  # MULTIPROCESSOR_COUNT
out = []
for mib in map(int, sys.argv[1:]):
    ptr = ctypes.c_uint64()
    code = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20))
    out.append("ok" if code == 0 else f"err{code}")
print(f"ready sms={sms.value} allocs={','.join(out) or '-'}", flush=True)
sys.stdin.readline()
"""


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    detail: str


@dataclass
class Client:
    """A running CUDA child: its pid and what it printed once ready."""

    proc: subprocess.Popen[str]
    line: str

    @property
    def ready(self) -> bool:
        return self.line.startswith("ready")

    def field(self, name: str) -> str:
        for word in self.line.split():
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        return ""


@contextlib.contextmanager
def cuda_client(env: dict[str, str], *mibs: int, timeout_s: float = 90.0) -> Iterator[Client]:
    """Run :data:`CHILD` with ``env``; yields once it is ready (or failed); kills it after."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *map(str, mibs)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = _readline(proc, timeout_s)
        yield Client(proc, line)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            return "timeout"
    return proc.stdout.readline().strip() or f"exited {proc.poll()}"


def _binding_version(nv: Any) -> str:
    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return str(getattr(nv, "__version__", "unknown"))


class Probe:
    """Runs the checks; ``rows`` holds the table."""

    def __init__(self, nvml: Any | None = None) -> None:
        self.rows: list[Row] = []
        self._nvml = nvml

    def add(self, check: str, status: str, detail: str) -> None:
        self.rows.append(Row(check, status, detail))

    @property
    def failures(self) -> int:
        return sum(r.status == FAIL for r in self.rows)

    def run(self) -> int:
        try:
            backend = NvmlBackend(nvml=self._nvml)
        except GpuUnavailable as exc:
            self.add("driver", FAIL, str(exc))
            return self.failures
        try:
            self._versions(backend)
            self._calls(backend)
            self._memory(backend)
            self._nvlink(backend)
            self.add(
                "xid events",
                PASS if backend.xid_events_supported else INFO,
                "event set registered" if backend.xid_events_supported else "not supported",
            )
            whole = [d for d in backend.inventory() if not d.mig_enabled]
            if not whole:
                self.add("cuda", SKIP, "every GPU has MIG enabled: no whole GPU to test on")
            elif self._cuda_works(whole[0]):
                self._context(backend, whole[0])
                self._release(backend, whole[0])
                self._mps(backend, whole)
        finally:
            backend.close()
        return self.failures

    # -- checks

    def _versions(self, backend: NvmlBackend) -> None:
        nv = backend._nv
        cuda = None
        with contextlib.suppress(Exception):
            cuda = nv.nvmlSystemGetCudaDriverVersion()
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else "?"
        names = sorted({d.name for d in backend.inventory()})
        self.add(
            "versions",
            INFO,
            f"driver {backend.driver_version}, CUDA {cuda_text}, nvidia-ml-py "
            f"{_binding_version(nv)}; {len(backend.inventory())} GPU(s): {', '.join(names)}",
        )
        for problem in backend.problems:
            self.add("gpu at start", FAIL, problem)

    def _calls(self, backend: NvmlBackend) -> None:
        try:
            for _ in range(3):
                telemetry = backend.sample()
        except Exception as exc:  # the backend must never raise: that is the check
            self.add("sample()", FAIL, f"raised {type(exc).__name__}: {exc}")
            return
        self.add("sample()", PASS, f"3 samples, {len(telemetry.devices)} device(s) each")
        for name, outcome in sorted(backend.calls.outcomes.items()):
            bad = outcome == "lost" or outcome.startswith("failed")
            self.add(f"call {name}", FAIL if bad else PASS, outcome)
        for sample in telemetry.devices:
            for failure in sample.failed_calls:
                self.add(f"sample {sample.uuid[:20]}", FAIL, failure)

    def _memory(self, backend: NvmlBackend) -> None:
        nv = backend._nv
        for info, handle in zip(backend.inventory(), backend._handles, strict=True):
            v1 = nv.nvmlDeviceGetMemoryInfo(handle)
            try:
                v2 = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
            except Exception as exc:
                self.add(f"memory {info.uuid[:20]}", INFO, f"v2 unavailable ({exc}); v1 only")
                continue
            mib = 1 << 20
            self.add(
                f"memory {info.uuid[:20]}",
                INFO,
                f"v1 used {v1.used // mib} MiB; v2 used {v2.used // mib} MiB + reserved "
                f"{v2.reserved // mib} MiB of {v1.total // mib} MiB (gpupool reports v2 used)",
            )

    def _nvlink(self, backend: NvmlBackend) -> None:
        nv = backend._nv
        inv = backend.inventory()
        if len(inv) < 2:
            self.add("nvlink", SKIP, "one GPU: no NVLink group to check")
            return
        groups = nvlink_groups(inv)
        missed = []
        caps = getattr(nv, "NVML_P2P_CAPS_INDEX_NVLINK", None)
        for i, a in enumerate(inv):
            for j in range(i + 1, len(inv)):
                b = inv[j]
                try:
                    ok = nv.nvmlDeviceGetP2PStatus(
                        backend._handles[i], backend._handles[j], caps
                    ) == getattr(nv, "NVML_P2P_STATUS_OK", 0)
                except Exception:
                    ok = False
                if ok and (groups[a.uuid] is None or groups[a.uuid] != groups[b.uuid]):
                    missed.append((a.index, b.index))
        self.add(
            "nvlink",
            FAIL if missed else PASS,
            f"groups {sorted(set(groups.values()), key=str)}; NVLink P2P pairs not grouped: "
            f"{missed or 'none'}",
        )

    def _cuda_works(self, device: DeviceInfo) -> bool:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid}
        with cuda_client(env) as client:
            if client.ready:
                return True
            self.add("cuda", SKIP, f"no CUDA context could be made ({client.line})")
            return False

    def _context(self, backend: NvmlBackend, device: DeviceInfo) -> None:
        measured = measure_context_mib(backend, device)
        assumed = default_context_mib(device)
        if measured is None:
            self.add("context size", FAIL, "NVML lists no memory for a bare CUDA context")
            return
        status = PASS if measured <= assumed + ALLOWANCE_MIB else INFO
        self.add(
            "context size",
            status,
            f"{device.name}: a bare context holds {measured} MiB (default reserve {assumed} "
            f"+ {ALLOWANCE_MIB} MiB; the agent measures it at start)",
        )

    def _release(self, backend: NvmlBackend, device: DeviceInfo) -> None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid}
        with cuda_client(env, 4096) as client:
            if not client.ready:
                self.add("kill -> released", FAIL, f"the 4 GiB client failed: {client.line}")
                return
            pid = client.proc.pid
            start = time.monotonic()
            os.killpg(pid, 9)
            client.proc.wait()
            while time.monotonic() - start < 60:
                sample = backend.sample().by_uuid()[device.uuid]
                if all(p.pid != pid for p in sample.processes):
                    break
                time.sleep(0.05)
            gone = time.monotonic() - start
        self.add(
            "kill -> released",
            PASS if gone < 30 else FAIL,
            f"NVML stopped listing a killed 4 GiB process after {gone:.2f}s "
            "(the agent waits up to 30s before freeing its slice)",
        )

    def _mps(self, backend: NvmlBackend, whole: list[DeviceInfo]) -> None:
        if shutil.which("nvidia-cuda-mps-control") is None:
            self.add("mps", SKIP, "nvidia-cuda-mps-control is not installed")
            return
        root = Path(tempfile.mkdtemp(prefix="gpm", dir="/tmp"))
        root.chmod(0o755)
        daemon = MpsDaemon(root)
        if not daemon.start():
            self.add("mps", SKIP, "the MPS daemon did not start (another one owns the GPU?)")
            return
        try:
            self._mps_checks(daemon, whole)
        finally:
            daemon.stop()
            shutil.rmtree(root, ignore_errors=True)

    def _mps_checks(self, daemon: MpsDaemon, whole: list[DeviceInfo]) -> None:
        device = whole[1] if len(whole) > 1 else whole[0]  # not the first, where there is one
        slice_mib, milli = 2048, 250
        ctx = SliceContext(
            (SliceDevice(device.uuid, device.memory_mib),),
            milli,
            slice_mib,
            mps_pipe_dir=str(daemon.pipe_dir),
            mps_log_dir=str(daemon.log_dir),
        )
        plain = {**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid}
        plain.pop("CUDA_MPS_PIPE_DIRECTORY", None)
        with cuda_client(plain) as client:  # outside MPS: every SM of the GPU
            total_sms = int(client.field("sms") or 0) or device.sm_count or 0
        env = {**plain, **isolation_env("mps", ctx)}
        tenant = mpsplan.MpsTenant(os.getuid(), (device.uuid,), milli, slice_mib)
        percentage, memory = mpsplan.server_limits([tenant], tenant.uid)
        problem = daemon.limit(tenant.uid, percentage, memory)
        self.add(
            "mps server limits",
            FAIL if problem else PASS,
            problem or f"{percentage}%, {memory} MiB set on the server of uid {tenant.uid}",
        )
        with cuda_client(env, 1024) as client:
            attached = client.ready and client.proc.pid in daemon.clients()
            self.add(
                "mps attached",
                PASS if attached else FAIL,
                f"client {client.proc.pid}: {client.line}; in the server's client list: {attached}",
            )
            sms = int(client.field("sms") or 0)
            expected = math.ceil(total_sms * percentage / 100)
            self.add(
                "mps sm share",
                PASS if 0 < sms <= expected + 2 else FAIL,
                f"{sms} of {total_sms} SMs visible for {percentage}% (expected about {expected})",
            )
        with cuda_client(env, slice_mib * 2) as client:
            self.add(
                "mps memory limit",
                PASS if client.field("allocs") == f"err{CUDA_ERROR_OUT_OF_MEMORY}" else FAIL,
                f"{slice_mib * 2} MiB on {device.uuid[:20]} (index {device.index}) with a "
                f"{slice_mib} MiB slice: {client.line}",
            )
        override = {
            **env,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{device.uuid}=64G",
        }
        with cuda_client(override, slice_mib * 2) as client:
            refused = client.field("allocs").startswith("err") or not client.ready
            self.add(
                "mps override refused",
                PASS if refused else FAIL,
                f"a job re-exporting 100% and 64G: {client.line}",
            )
        gone = {**env, "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir) + "-missing"}
        with cuda_client(gone, 64) as client:
            detected = client.ready and client.proc.pid not in daemon.clients()
            self.add(
                "mps fallback detected",
                PASS if detected or not client.ready else FAIL,
                f"client with an unreachable pipe: {client.line}; absent from the client "
                f"list (the agent reports it as running without MPS): {detected}",
            )


def render(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows) if rows else 5
    lines = [f"{'check'.ljust(width)}  result  detail", f"{'-' * width}  ------  ------"]
    lines += [f"{r.check.ljust(width)}  {r.status.ljust(6)}  {r.detail}" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpupool.agent.probe", description=__doc__)
    parser.parse_args(argv)
    probe = Probe()
    failures = probe.run()
    print(render(probe.rows))
    print(f"\n{failures} check(s) failed" if failures else "\nno check failed")
    return min(failures, 100)


if __name__ == "__main__":
    sys.exit(main())
