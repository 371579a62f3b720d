"""``gpupool run`` and ``gpupool logs`` against a real pool: big output, both streams, exact.

The job writes tens of MiB to stdout and stderr, interleaved, in writes of every size (so lines
and multibyte characters are split across the agent's chunks and the client's pages); the CLI
must hand back both streams byte for byte, stdout on stdout and stderr on stderr (like srun),
and exit with the job's exit code.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.e2e.pool import PY, REPO, Pool

#: The job's program, also run here to know what it writes. ``produce(out, err)`` calls
#: ``out(bytes)`` / ``err(bytes)`` in the order the job writes them.
PRODUCER = r"""
import os, random, sys

def produce(out, err, out_total, err_total, seed=17):
    rng = random.Random(seed)
    words = ["alpha", "\u03b2eta", "\u65e5\u672c\u8a9e", "caf\u00e9", "\U0001f680", "tab\there",
             "x" * 300, ""]
    pending = {1: bytearray(), 2: bytearray()}
    sizes = {1: 0, 2: 0}
    totals = {1: out_total, 2: err_total}
    sinks = {1: out, 2: err}
    line = 0
    while sizes[1] < totals[1] or sizes[2] < totals[2]:
        fd = 2 if (sizes[2] < totals[2] and (rng.random() < 0.1 or sizes[1] >= totals[1])) else 1
        text = f"{fd}:{line:07d} " + " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        data = (text + "\n").encode()
        line += 1
        pending[fd] += data
        sizes[fd] += len(data)
        if len(pending[fd]) >= rng.randint(1, 70000):  # a write of any size, mid-line too
            cut = rng.randint(1, len(pending[fd]))
            sinks[fd](bytes(pending[fd][:cut]))
            del pending[fd][:cut]
    sinks[2](bytes(pending[2]))
    sinks[1](bytes(pending[1]) + "the end, no newline".encode())

def write_all(fd):
    def write(data):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    return write
"""

MIB = 1024 * 1024


def expected(out_total: int, err_total: int) -> tuple[bytes, bytes]:
    scope: dict[str, object] = {}
    exec(PRODUCER, scope)
    out, err = bytearray(), bytearray()
    scope["produce"](out.extend, err.extend, out_total, err_total)  # type: ignore[operator]
    return bytes(out), bytes(err)


def job_program(out_total: int, err_total: int, code: int) -> str:
    return (
        PRODUCER
        + f"\nproduce(write_all(1), write_all(2), {out_total}, {err_total})\nsys.exit({code})\n"
    )


def cli(
    pool: Pool, home: Path, *args: str, timeout: float = 900
) -> subprocess.CompletedProcess[bytes]:
    token = (pool.home / "admin-token").read_text().strip()
    env = {**os.environ, "GPUPOOL_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [PY, "-m", "gpupool.cli", *args[:1], "--server", pool.url, "--token", token, *args[1:]],
        check=False,
        env=env,
        capture_output=True,
        timeout=900,
    )


def test_run_of_a_job_writing_50mib_stdout_and_5mib_stderr_gives_both_byte_for_byte(
    pool: Pool, tmp_path: Path
) -> None:
    want_out, want_err = expected(50 * MIB, 5 * MIB)
    program = job_program(50 * MIB, 5 * MIB, 7)
    ran = cli(pool, tmp_path, "run", "-J", "big", "-g", "0.25", "--", PY, "-c", program)
    assert ran.returncode == 7, ran.stderr[-2000:]
    assert len(ran.stdout) == len(want_out)
    assert ran.stdout == want_out
    # stderr: the job's own bytes, between gpupool's lines (submitted ... / ended ...)
    head, found, tail = ran.stderr.partition(want_err)
    assert found, (len(ran.stderr), ran.stderr[:300], ran.stderr[-300:])
    own = head.decode().splitlines()  # gpupool's own lines, before the job's
    assert own[0].startswith("Submitted job "), head
    assert all(line.startswith("gpupool: job ") for line in own[1:]), head
    assert head.endswith(b"\n")
    job_id = own[0].split()[2]
    assert (
        tail.decode()
        == f"job {job_id} ended FAILED (attempt ended: FAILED): see gpupool show {job_id}\n"
    )

    # the whole log can be fetched afterwards too, both streams, nothing cut
    logs = cli(pool, tmp_path, "logs", job_id)
    assert logs.returncode == 0, logs.stderr[-2000:]
    assert logs.stdout == want_out
    errors = cli(pool, tmp_path, "logs", job_id, "--stderr")
    assert errors.stdout == want_err
