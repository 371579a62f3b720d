"""Test helpers for the CUDA shim: the fake driver and probe builds, and a driven probe process.

The fake driver (csrc/fake_cuda.c) stands in for libcuda.so.1: host memory for device memory, one
"GPU" thread per process that busy-waits each kernel's duration and logs it. The probe
(csrc/probe.c) is a CUDA program that finds the driver as a CUDA 12 runtime does and answers one
command per line.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpupool.shim.build import CSRC, ShimBuild

HERE = Path(__file__).resolve().parent / "csrc"
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{CSRC}"]
DEADLINE_S = 120.0
LOG_RECORD = struct.Struct("<iiQQ")


def fake_uuid(index: int) -> str:
    raw = b"gpupoolfakegpu" + bytes([0, index])
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def cc(args: list[str], cwd: Path) -> None:
    proc = subprocess.run(["cc", *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@dataclass(frozen=True)
class Natives:
    """The shim build and the test programs built against it."""

    shim: ShimBuild
    fake: Path  # the fake libcuda.so.1
    fake_nvml: Path  # the fake libnvidia-ml.so.1, beside it
    probe: Path
    direct: Path  # a program linked against libcuda.so.1 itself


def natives_in(out: Path, shim: ShimBuild) -> Natives:
    """Where :func:`build_natives` puts the programs it builds in ``out``."""
    fake_dir = out / "fake"
    return Natives(shim=shim, fake=fake_dir / "libcuda.so.1",
                   fake_nvml=fake_dir / "libnvidia-ml.so.1", probe=out / "probe",
                   direct=out / "direct")  # fmt: skip


def build_natives(out: Path, shim: ShimBuild) -> Natives:
    built = natives_in(out, shim)
    fake_dir = built.fake.parent
    fake_dir.mkdir(parents=True, exist_ok=True)
    fake = built.fake
    cc([*CFLAGS, "-fPIC", "-shared", "-fvisibility=hidden", str(HERE / "fake_cuda.c"), "-o",
        str(fake), "-Wl,-soname,libcuda.so.1", "-ldl", "-lpthread"], out)  # fmt: skip
    fake_nvml = built.fake_nvml
    cc([*CFLAGS, "-fPIC", "-shared", "-fvisibility=hidden", str(HERE / "fake_nvml.c"), "-o",
        str(fake_nvml), "-Wl,-soname,libnvidia-ml.so.1"], out)  # fmt: skip
    cc([*CFLAGS, str(HERE / "probe.c"), "-o", str(built.probe), "-ldl", "-lpthread"], out)
    cc(
        [*CFLAGS, str(HERE / "direct.c"), "-o", str(built.direct), f"-L{fake_dir}",
         "-l:libcuda.so.1"],
        out,
    )  # fmt: skip
    return built


class Probe:
    """A running probe; :meth:`do` sends one command and returns the answer's words."""

    def __init__(self, binary: Path, env: Mapping[str, str], mode: str = "default") -> None:
        self.proc = subprocess.Popen(
            [str(binary), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            text=True,
            bufsize=1,
        )
        self.pid = self.proc.pid

    def do(self, line: str) -> list[str]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.answer(line)

    def answer(self, line: str) -> list[str]:
        """The words of the next answer, to ``line`` sent before (by :meth:`do` or directly)."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], DEADLINE_S)
        assert ready, f"probe gave no answer to {line!r} in {DEADLINE_S} s"
        answer = self.proc.stdout.readline().split()
        assert answer, f"probe ended on {line!r}: {self.stderr()}"
        return answer

    def ok(self, line: str) -> list[str]:
        return self.ok_answer(line, self.do(line))

    def ok_answer(self, line: str, answer: list[str]) -> list[str]:
        assert answer[0] == "ok", f"{line!r} -> {answer}; stderr: {self.stderr_so_far()}"
        return answer[1:]

    def err(self, line: str) -> int:
        answer = self.do(line)
        assert answer[0] == "err", f"{line!r} should have failed, got {answer}"
        return int(answer[1])

    def stderr_so_far(self) -> str:
        assert self.proc.stderr is not None
        out = []
        while select.select([self.proc.stderr], [], [], 0)[0]:
            chunk = os.read(self.proc.stderr.fileno(), 65536)
            if not chunk:
                break
            out.append(chunk.decode())
        return "".join(out)

    def stderr(self) -> str:
        self.close()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
            self.proc.wait(timeout=DEADLINE_S)


def wait_for(cond, what: str, deadline_s: float = DEADLINE_S):  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def kernel_records(log: Path) -> list[tuple[int, int, int, int]]:
    data = log.read_bytes() if log.exists() else b""
    n = len(data) // LOG_RECORD.size
    return [LOG_RECORD.unpack_from(data, i * LOG_RECORD.size) for i in range(n)]
