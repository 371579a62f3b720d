"""NVML inside a shimmed job reports the slice: what nvidia-smi and NVML-sizing frameworks see."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.shim.conftest import MIB, shim_env
from tests.shim.helpers import Probe, fake_uuid

READ_NVML = r"""
import ctypes, json
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]
class Mem2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
out = []
n = ctypes.c_uint()
nvml.nvmlDeviceGetCount_v2(ctypes.byref(n))
for i in range(n.value):
    h = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
    name = ctypes.create_string_buffer(64)
    assert nvml.nvmlDeviceGetName(h, name, 64) == 0
    m, m2 = Mem(), Mem2()
    m2.version = (2 << 24) | ctypes.sizeof(Mem2)
    assert nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0
    assert nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m2)) == 0
    out.append([name.value.decode(), m.total, m.free, m.used, m2.total, m2.free, m2.used])
print(json.dumps(out))
"""


def read_nvml(env: dict[str, str]) -> list[list]:  # type: ignore[type-arg]
    proc = subprocess.run([sys.executable, "-c", READ_NVML], env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_nvml_in_a_shimmed_job_reports_the_slice_and_its_usage(natives, make_region, probes):
    region = make_region(limit=64 * MIB)
    env = shim_env(natives, region, FAKE_CUDA_DEVICES="2", FAKE_NVML_USED=str(5 * MIB))
    gpu0, gpu1 = read_nvml(env)
    assert gpu0 == ["Fake GPU 0", 64 * MIB, 64 * MIB, 0, 64 * MIB, 64 * MIB, 0]
    # Device 1 is not in the slice: NVML's own answer, forwarded through the façade.
    total = 80 << 30
    assert gpu1 == ["Fake GPU 1", total, total - 5 * MIB, 5 * MIB, total, total - 5 * MIB, 5 * MIB]
    p = Probe(natives.probe, env)
    probes.append(p)
    p.ok("init")
    p.ok(f"alloc {24 * MIB}")
    gpu0, _ = read_nvml(env)
    assert gpu0[1:4] == [64 * MIB, 40 * MIB, 24 * MIB]
    assert region.read().device(fake_uuid(0)).used_bytes == 24 * MIB
