"""Job commands, in Slurm's words: ``submit`` (sbatch), ``run`` (srun), ``queue`` (squeue);
reading one job (``show``, ``logs``, ``fetch``, ``history``) is :mod:`gpupool.cli.jobinfo`,
changing queued ones (``cancel``, ``hold``, ...) :mod:`gpupool.cli.jobctl`.

``submit``, ``run`` and ``queue`` are hot verbs: their options are declared in
:mod:`gpupool.cli.options` (the typer commands here are made from those tables by
:func:`gpupool.cli.typed.command`), their one implementation is :mod:`gpupool.cli.hotjobs`, and
``gpupool submit ...`` usually runs it without this module (:mod:`gpupool.cli.hot`). What is
left here is ``run``'s following of the job's output, through the SDK. ``submit`` turns its
options into job-file keys in :mod:`gpupool.cli.submitspec`.
"""

from __future__ import annotations

import functools
import signal
import socket
import sys
from collections.abc import Iterable
from types import FrameType
from typing import Any

import typer

from gpupool.cli import hotjobs
from gpupool.cli.options import QUEUE, SUBMIT
from gpupool.cli.session import session
from gpupool.cli.submitspec import build_submission, export_env
from gpupool.cli.typed import command
from gpupool.client.errors import EXIT_FAILED
from gpupool.client.logs import LogPiece, PendingNotice
from gpupool.client.sdk import Client
from gpupool.schemas.jobs import JobView

__all__ = ["build_submission", "export_env", "install", "queue", "run", "submit", "write_output"]


def follow_job(params: dict[str, Any], job_id: str) -> int:
    """``gpupool run`` after its submit (:func:`gpupool.cli.hotjobs.submit`): the job's output
    until it ends, through the SDK; the exit code to leave with."""
    with session(params.get("server"), params.get("token")) as gp:
        return _follow(gp, gp.get(job_id))


def follow_pty(params: dict[str, Any], job_id: str, listener: socket.socket, key: str) -> int:
    """``gpupool run --pty`` after its submit: the job's terminal (:mod:`gpupool.cli.ptyrun`)
    until it ends; the exit code to leave with."""
    from gpupool.cli import ptyrun

    with session(params.get("server"), params.get("token")) as gp:
        return ptyrun.session(gp, gp.get(job_id), listener, key, _exit_code)


class _Terminated(Exception):
    """SIGTERM reached ``gpupool run`` (a CI system cancelling its step, ``kill``)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def _follow(gp: Client, job: JobView) -> int:
    """Stream the job's stdout to stdout and its stderr to stderr (like srun), byte for byte,
    until it ends; the exit code to leave with. While it waits, why it waits is said on
    stderr each time the reason changes.

    Ctrl-C cancels the job (as with srun) and exits 130; SIGTERM (how CI systems cancel a
    step) cancels it too and exits 143.
    """
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    notice = PendingNotice(lambda line: typer.echo(line, err=True))
    try:
        write_output(
            gp.output(job.id, streams=("stdout", "stderr"), follow=True, on_poll=notice),
            gang=job.replicas > 1,
        )
        final = gp.wait(job.id, on_poll=notice)
    except (KeyboardInterrupt, _Terminated) as exc:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one cancel, even if CI sends more
        what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        gp.cancel(job.id, reason=f"interrupted: {what} on gpupool run")
        typer.echo(f"\ncancelled job {job.id}", err=True)
        return 130 if isinstance(exc, KeyboardInterrupt) else 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _exit_code(final)


def _exit_code(final: JobView) -> int:
    """``run``'s exit status for a job that ended as ``final`` (its own exit code when it
    failed with one), saying on stderr how it ended when not ``COMPLETED``."""
    if final.state == "COMPLETED":
        return 0
    typer.echo(
        f"job {final.id} ended {final.state}"
        + (f" ({final.reason})" if final.reason else "")
        + f": see gpupool show {final.id}",
        err=True,
    )
    return final.exit_code if final.exit_code not in (None, 0) else EXIT_FAILED


def write_output(pieces: Iterable[LogPiece], *, gang: bool, one_stream: bool = False) -> None:
    """Write log pieces as they come: stdout's bytes to stdout, stderr's to stderr (with
    ``one_stream``, all to stdout), exactly; a gang's lines prefixed with their rank. What is
    missing is said on stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    sinks = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
    if one_stream:
        sinks["stderr"] = sinks["stdout"]
    partial: dict[tuple[int, str], bytes] = {}
    for piece in pieces:
        sink = sinks[piece.stream]
        key = (piece.replica, piece.stream)
        prefix = f"[{piece.replica}] ".encode() if gang else b""
        text = piece.notice()
        if text is not None:
            if partial.get(key):
                sink.write(prefix + partial.pop(key) + b"\n")
                sink.flush()
            sys.stderr.buffer.write(prefix + text.encode() + b"\n")
            sys.stderr.buffer.flush()
        data = piece.data
        if gang:
            data = partial.pop(key, b"") + data
            cut = data.rfind(b"\n") + 1
            partial[key] = data[cut:]
            data = b"".join(prefix + line for line in data[:cut].splitlines(keepends=True))
        sink.write(data)
        sink.flush()
    for (rank, stream), rest in partial.items():
        if rest:
            sinks[stream].write(f"[{rank}] ".encode() + rest)
            sinks[stream].flush()


SUBMIT_HELP = """Submit a job to the pool (like sbatch).

    Examples:

      gpupool submit -J train -g 0.5 --gpu-mem 10GiB -- python train.py --epochs 10

      gpupool submit -g 2 --gpu-type A100 -q high -t 4:00:00 --wrap "python a.py | tee log"

      gpupool submit -f examples/train.yaml -p research --parsable

      gpupool submit -a 0-9 -g 0.25 --wrap 'python sweep.py --trial $GPUPOOL_ARRAY_TASK_ID'

    --workdir DIR: the folder is packed (without .git, __pycache__, .venv) and uploaded (at
    most 100 MiB packed), and the job runs in a copy of it on its node; gpupool fetch JOB DEST
    brings back what it wrote there. Without it, the job starts in the directory you submit
    from when its node can see it (a gpupool up pool always can), else in a folder of its own.

    --export (like sbatch): ALL (the default) gives the job your environment, but names
    gpupool sets (CUDA_VISIBLE_DEVICES, GPUPOOL_*...) and gpupool's own virtual environment;
    NONE gives none of it; FOO,BAR=1 only those (ALL,BAR=1 adds to ALL). -e KEY=VALUE wins.

    --array: one job per index, named NAME[INDEX], each with GPUPOOL_ARRAY_TASK_ID (and
    GPUPOOL_ARRAY_JOB_ID, _TASK_COUNT, _TASK_MIN, _TASK_MAX); --parsable prints every id.
    """

RUN_HELP = """Submit a job, stream its output until it ends, exit with its exit code (like srun).

    Takes the same options as submit.

    Examples:

      gpupool run -g 0.25 -- python -c "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"

      gpupool run --wrap "nvidia-smi; python eval.py" -t 30

      gpupool run -g 1 -t 20 --workdir . -- pytest tests/gpu    # a CI step on the pool

    The job's stdout goes to stdout and its stderr to stderr, byte for byte; while it waits,
    why it waits is said on stderr each time the reason changes. Ctrl-C cancels the job and
    exits 130; SIGTERM (a CI system cancelling the step) cancels it and exits 143.
    """


submit = command("submit", SUBMIT_HELP, SUBMIT, hotjobs.submit)
run = command("run", RUN_HELP, SUBMIT, functools.partial(hotjobs.submit, follow=True))

QUEUE_HELP = """List queued and running jobs (like squeue), with GPU slice, REASON and START
    estimate.

    Examples:

      gpupool queue

      gpupool queue --me -t PD

      gpupool queue -p research --json
    """

queue = command("queue", QUEUE_HELP, QUEUE, hotjobs.queue)


def install(app: typer.Typer) -> None:
    for verb in (submit, run, queue):
        app.command(
            name=verb.__name__,
            context_settings={"allow_interspersed_args": verb not in (submit, run)},
        )(verb)
