"""``gpupool alloc``: an interactive allocation, like Slurm's ``salloc``.

It asks for a slice, waits until the scheduler grants it, says so (the job id, the node, the
devices and the environment it sets), then runs the user's shell (``$SHELL``, else
``/bin/sh``), or the command given after ``--``, *on this machine* with that environment:
``CUDA_VISIBLE_DEVICES`` (the slice's device UUIDs) and ``GPUPOOL_ALLOCATION`` (the job id),
also as ``GPUPOOL_JOB_ID``. When the shell ends, the allocation is released (its holder job
cancelled) and ``alloc`` exits with the shell's exit status.

**Why here and not on the node.** This is what ``salloc`` does by default: the shell is the
user's own, on the machine they typed on, and it holds the allocation while it lives. A CUDA
program in that shell uses ``CUDA_VISIBLE_DEVICES``, so the slice must be on *this* machine's
GPUs: the holder job is the one :func:`gpupool.client.notebook.start_allocation` makes for
``gpupool.allocate()`` and ``%gpupool alloc`` (one code path), pinned to this machine's node
(``--node`` when its agent runs under another name). A machine that is not a node of the pool
is refused with what to do instead: ``gpupool run --pty bash`` opens a shell on whichever node
the scheduler picks (srun --pty), through that node's agent.

While it waits, why it waits is said on stderr; Ctrl-C (or SIGTERM) while waiting cancels the
request and exits 130 (143). Inside the shell, Ctrl-C belongs to the shell: ``alloc`` ignores
SIGINT and SIGQUIT while its child runs, as ``salloc`` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
from types import FrameType
from typing import Annotated

import typer

from gpupool.cli.session import QosOpt, ServerOpt, TokenOpt, fail, session
from gpupool.cli.sliceopts import AccountOpt, CpusOpt, GpuMemOpt, GpusOpt, MemOpt, PoolOpt

#: What ``alloc`` sets for its child, beside CUDA_VISIBLE_DEVICES and GPUPOOL_ALLOCATION.
JOB_ID_ENV = "GPUPOOL_JOB_ID"


class _Terminated(Exception):
    """SIGTERM while the request waits."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def alloc(  # noqa: PLR0917 - salloc-like options
    argv: Annotated[
        list[str] | None, typer.Argument(help="the command to run instead of your shell")
    ] = None,
    gpus: GpusOpt = "1",
    gpu_mem: GpuMemOpt = None,
    gpu_type: Annotated[
        str | None, typer.Option("--gpu-type", help="allowed GPU model, e.g. A100 or A100|H100")
    ] = None,
    cpus: CpusOpt = None,
    mem: MemOpt = None,
    pool: PoolOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    time_limit: Annotated[
        str, typer.Option("-t", "--time", help="how long it may be held: 90 (minutes), 8:00:00")
    ] = "8:00:00",
    job_name: Annotated[
        str | None, typer.Option("-J", "--job-name", help="job name (interactive-USER)")
    ] = None,
    node: Annotated[
        str | None,
        typer.Option("--node", help="this machine's node name, when its agent uses another"),
    ] = None,
    wait: Annotated[
        str, typer.Option("--wait", help="give up if not granted within this time")
    ] = "24:00:00",
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Hold a slice on this machine and open a shell with it (like salloc).

    Examples:

      gpupool alloc -g 0.5 --gpu-mem 20GiB          # a shell; exit it to release

      gpupool alloc -g 1 -t 2:00:00 -- python train.py

    It prints the job id and the environment, then runs $SHELL (or the command after --) on
    this machine, with CUDA_VISIBLE_DEVICES set to the slice's GPUs and GPUPOOL_ALLOCATION and
    GPUPOOL_JOB_ID to the job id.

    Ending the shell releases the allocation; alloc exits with its status. Ctrl-C while
    waiting cancels the request.

    The slice is on this machine's node (--node NAME if its agent uses another name). For a
    shell on whichever node the scheduler picks, use gpupool run --pty bash.
    """
    from gpupool.client.errors import ClientError
    from gpupool.client.notebook import start_allocation
    from gpupool.domain.errors import InvalidValue
    from gpupool.domain.units import parse_duration

    try:
        timeout_s = parse_duration(wait, field="--wait")
    except InvalidValue as exc:
        raise fail(str(exc)) from None
    options = {
        "gpu_types": gpu_type,
        "cpus": cpus,
        "memory": mem,
        "pool": pool,
        "tenant": account,
        "priority": qos,
        "name": job_name,
        "node": node,
    }
    given = {k: v for k, v in options.items() if v is not None}
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    with session(server, token, cli_options=True) as gp:
        try:
            held = start_allocation(
                gp, gpus or "1", gpu_mem, hold=time_limit, timeout_s=timeout_s, **given
            )
        except (KeyboardInterrupt, _Terminated) as exc:
            # start_allocation cancelled the request before re-raising
            typer.echo("\nalloc: request cancelled", err=True)
            raise typer.Exit(130 if isinstance(exc, KeyboardInterrupt) else 143) from None
        except ClientError as exc:
            raise fail(str(exc), int(exc.exit_code)) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
        with held:
            job = held.job
            where = f"node {job.nodes[0]}" if job.nodes else "this machine"
            os.environ[JOB_ID_ENV] = job.id
            typer.echo(f"alloc: granted job allocation {job.id} on {where}", err=True)
            for key in ("CUDA_VISIBLE_DEVICES", "GPUPOOL_ALLOCATION", JOB_ID_ENV):
                typer.echo(f"alloc: {key}={os.environ[key]}", err=True)
            command = list(argv) if argv else [os.environ.get("SHELL") or "/bin/sh"]
            code = _run_child(command)
            typer.echo(f"alloc: relinquishing job allocation {job.id}", err=True)
        os.environ.pop(JOB_ID_ENV, None)
    raise typer.Exit(code)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The parent's part of a Ctrl-C the child handles: none."""


def _run_child(command: list[str]) -> int:
    """Run ``command`` in the foreground with this process's environment; its exit status
    (128+N for a signal, as a shell reports it). SIGINT and SIGQUIT from the terminal reach
    the child too (same process group): ``alloc`` catches them and does nothing meanwhile (a
    handler, not ``SIG_IGN``, which the child would inherit across ``exec``)."""
    ignored = {s: signal.signal(s, _ignore) for s in (signal.SIGINT, signal.SIGQUIT)}
    try:
        try:
            proc = subprocess.Popen(command)
        except OSError as exc:
            typer.echo(f"error: cannot run {command[0]!r}: {exc.strerror or exc}", err=True)
            return 127
        code = proc.wait()
    finally:
        for s, handler in ignored.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def install(app: typer.Typer) -> None:
    app.command(name="alloc", context_settings={"allow_interspersed_args": False})(alloc)
