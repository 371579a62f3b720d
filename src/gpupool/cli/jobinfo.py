"""Reading jobs, like Slurm's ``scontrol show job`` (``show``) and ``sacct`` (``history``), plus
``logs`` (a job's output, byte for byte) and ``fetch`` (what it left in its uploaded folder).

``show`` and ``logs`` take a job id, a job array's id (every task) or ``ARRAY_INDEX`` (one
task): see :mod:`gpupool.cli.jobref`. ``logs`` of a job that failed and wrote nothing to the
stream asked for says so on stderr, where to look instead, and exits 1.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli import hotjobs, render
from gpupool.cli.jobref import resolve
from gpupool.cli.jobs import write_output
from gpupool.cli.options import SHOW
from gpupool.cli.session import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    emit,
    fail,
    handle_errors,
    print_json,
    session,
)
from gpupool.cli.typed import command as typed_command
from gpupool.client.errors import EXIT_FAILED
from gpupool.client.logs import LogPiece
from gpupool.client.sdk import Client
from gpupool.domain.clock import SystemClock
from gpupool.domain.units import parse_duration
from gpupool.schemas.jobs import JobView

SHOW_HELP = """Show one job: fields, why it waits, its priority factor table and its events.

    Examples:

      gpupool show 3f2a9c1d0b7e

      gpupool show 3f2a9c1d0b7e --json
    """

show = typed_command("show", SHOW_HELP, SHOW, hotjobs.show)


def logs(
    job_id: Annotated[str, typer.Argument(help="job id, job array id, or ARRAY_INDEX")],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="keep printing until it ends")
    ] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="show stderr instead of stdout")] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a job's output, all of it as the server keeps it, byte for byte (its latest
    attempt; gang lines are prefixed with the rank).

    Examples:

      gpupool logs 3f2a9c1d0b7e

      gpupool logs -f 3f2a9c1d0b7e

      gpupool logs --stderr 3f2a9c1d0b7e > errors.txt

      gpupool logs 5d4c3b2a1f0e_3          # task 3 of a job array (its id: every task)

    The server keeps the newest 64 MiB (log_keep_bytes) of each replica's stdout and stderr
    (the agent ships new output every second); when older bytes were dropped, stderr says
    how many. -f polls until the job ends and its node has sent the end of the log.
    """
    stream = "stderr" if stderr else "stdout"
    with session(server, token) as gp:
        found = resolve(gp, job_id)
        if isinstance(found, list) and follow:
            raise fail(f"{job_id} is a job array: follow one task, e.g. gpupool logs -f {job_id}_0")
        code = 0
        for job in found if isinstance(found, list) else [found]:
            if isinstance(found, list):
                sys.stdout.flush()
                typer.echo(f"==> {job.name} (job {job.id}) <==")
            written = _write_counted(gp.output(job.id, streams=(stream,), follow=follow), job)
            if not written:
                code = max(code, _nothing_written(gp.get(job.id), stream))
        if code:
            raise typer.Exit(code)


def _write_counted(pieces: Iterable[LogPiece], job: JobView) -> int:
    """Write ``pieces`` as ``logs`` does; the number of bytes they held."""
    count = 0

    def counted() -> Iterator[LogPiece]:
        nonlocal count
        for piece in pieces:
            count += len(piece.data)
            yield piece

    write_output(counted(), gang=job.replicas > 1, one_stream=True)
    return count


def _nothing_written(job: JobView, stream: str) -> int:
    """Say why a job's ``stream`` is empty, on stderr; the exit code (1: it failed)."""
    other = "stderr" if stream == "stdout" else "stdout"
    flag = "--stderr " if other == "stderr" else ""
    if job.state in ("PENDING", "REQUEUED"):
        why = f": {job.pending_reason}" if job.pending_reason else ""
        typer.echo(f"job {job.id} has not started yet ({job.state}{why})", err=True)
        return 0
    if job.state in ("COMPLETED", "RUNNING", "CONFIGURING", "COMPLETING"):
        return 0
    ended = f"job {job.id} ended {job.state}" + (
        f" with exit code {job.exit_code}" if job.exit_code is not None else ""
    )
    typer.echo(
        f"{ended} and wrote nothing to {stream}: see gpupool logs {flag}{job.id} and "
        f"gpupool show {job.id} (its reason: {job.reason or 'none given'})",
        err=True,
    )
    return EXIT_FAILED


def fetch(
    job_id: Annotated[str, typer.Argument(help="job id")],
    dest: Annotated[Path, typer.Argument(help="a new or empty folder to unpack them into")],
    replica: Annotated[int, typer.Option("-r", "--replica", help="which replica's copy")] = 0,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Fetch what a job left in its uploaded working directory (submit --workdir DIR): the
    node sends the copy back when the job ends, as it is (without .git, __pycache__, .venv).

    Examples:

      gpupool run -g 1 --workdir . -- python train.py --out results/

      gpupool fetch 3f2a9c1d0b7e ./train-output

    A job without --workdir ran in your submit directory or its workdir: read its files there.
    """
    with session(server, token) as gp:
        count = gp.fetch_results(job_id, dest, replica=replica)
    typer.echo(f"fetched {count} files of job {job_id} into {dest}", err=True)


def history(  # noqa: PLR0917 - typer options
    since: Annotated[
        str, typer.Option("-S", "--since", help="how far back: 1d, 12h, 90 (minutes)")
    ] = "1d",
    user: Annotated[str | None, typer.Option("-u", "--user", help="only this user")] = None,
    account: Annotated[str | None, typer.Option("-A", "--account", help="only this tenant")] = None,
    pool: Annotated[str | None, typer.Option("-p", "--pool", help="only this pool")] = None,
    states: Annotated[
        list[str] | None, typer.Option("-s", "--state", help="only these states (repeat)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="at most this many jobs")] = 1000,
    jobs_wanted: Annotated[
        list[str] | None,
        typer.Option(
            "-j", "--jobs", help="only these jobs (ids, array ids, ID_INDEX; repeat or a,b)"
        ),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List jobs submitted in a time window, with state, exit code and elapsed time (like sacct).

    Examples:

      gpupool history

      gpupool history -S 7d -A vision -s FAILED -s TIMEOUT

      gpupool history -j 3f2a9c1d0b7e,5d4c3b2a1f0e     # these jobs (an array id: its tasks)

    With -j the time window does not apply (as with sacct -j); the other filters do.
    """
    with handle_errors():
        window = parse_duration(since, field="--since")
    with session(server, token) as gp:
        now = SystemClock().now()
        if jobs_wanted:
            jobs = _named_jobs(gp, jobs_wanted)
            wanted = {s.upper() for s in states or ()}
            jobs = [
                j
                for j in jobs
                if (not wanted or j.state in wanted or j.state_code in wanted)
                and (user is None or j.user == user)
                and (account is None or j.tenant == account)
                and (pool is None or j.pool == pool)
            ][:limit]
        else:
            jobs = gp.list(state=states, user=user, tenant=account, pool=pool, limit=limit)
            jobs = [j for j in jobs if j.submit_time >= now - window]
        jobs.sort(key=lambda j: (j.submit_time, j.id))
        if json_out:
            print_json(jobs)
            return
        emit(render.history_table(jobs, now))


def _named_jobs(gp: Client, refs: list[str]) -> list[JobView]:
    """The jobs ``refs`` name (each a job id, an array id or ``ARRAY_INDEX``; comma lists too),
    each once."""
    found: dict[str, JobView] = {}
    for ref in (r.strip() for item in refs for r in item.split(",")):
        if not ref:
            continue
        got = resolve(gp, ref)
        for job in got if isinstance(got, list) else [got]:
            found[job.id] = job
    return list(found.values())


def install(app: typer.Typer) -> None:
    for command in (show, logs, fetch, history):
        app.command(name=command.__name__)(command)
