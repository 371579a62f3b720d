"""Commands that change jobs in the queue, like Slurm's ``scancel`` and ``scontrol hold |
release | requeue | update``.

- **cancel**: stop jobs (a running one gets its checkpoint signal and grace), by id or every
  unfinished task of a job array.
- **hold**: a pending job stays in the queue but is not considered until released (reason
  ``Held``); only pending jobs can be held.
- **release**: the job is considered again from the next scheduling cycle.
- **requeue**: a job that ended without finishing its work (failed, preempted, its node failed,
  it could not boot) goes back to the queue as pending, keeping its id, spec and history.
- **update**: a pending job's name, priority class, time limit, expected run time or
  preemptibility change (see :mod:`gpupool.control.services.jobedit`).

hold, release and requeue take several job ids and change them one by one, in the order
given; the first job that cannot be changed stops the command with its error (exit 3 not found,
6 conflict), and the jobs before it stay changed (each change is its own audited call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from gpupool.cli.jobs import ACTIVE
from gpupool.cli.session import (
    ExpectedOpt,
    JsonOpt,
    PreemptibleOpt,
    QosOpt,
    ServerOpt,
    TimeOpt,
    TokenOpt,
    fail,
    print_json,
    session,
)
from gpupool.client.sdk import Client
from gpupool.domain.units import format_duration
from gpupool.schemas.jobs import JobView

JobIds = Annotated[list[str], typer.Argument(help="job ids")]


def _apply(
    gp: Client, job_ids: list[str], action: Callable[[Client, str], JobView], json_out: bool
) -> None:
    """``action`` on each job in turn, printing what became of each (or them all as JSON)."""
    done = []
    for job_id in job_ids:
        job = action(gp, job_id)
        done.append(job)
        if not json_out:
            held = ", held" if job.held and job.state == "PENDING" else ""
            typer.echo(f"job {job.id} ({job.name}): {job.state}{held}")
    if json_out:
        print_json(done)


def _command(name: str, doc: str, action: Callable[[Client, str], JobView]) -> Callable[..., None]:
    """A command that applies ``action`` to each job id in turn and prints what became of it."""

    def command(
        job_ids: JobIds,
        server: ServerOpt = None,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        with session(server, token) as gp:
            _apply(gp, job_ids, action, json_out)

    command.__name__ = name
    command.__doc__ = doc
    return command


hold = _command(
    "hold",
    """Keep pending jobs from starting until they are released (like scontrol hold).

    Examples:

      gpupool hold 3f2a9c1d0b7e

      gpupool hold 3f2a9c1d0b7e 9a8b7c6d5e4f --json

    Only pending jobs can be held (exit 6 otherwise); gpupool queue shows them with reason JobHeld.
    """,
    Client.hold,
)
release = _command(
    "release",
    """Let held jobs start again (like scontrol release).

    Examples:

      gpupool release 3f2a9c1d0b7e

    The job keeps its place: its queue order still counts from when it became eligible.
    """,
    Client.release,
)
requeue = _command(
    "requeue",
    """Put jobs that ended without finishing back in the queue (like scontrol requeue).

    Examples:

      gpupool requeue 3f2a9c1d0b7e

    Failed, preempted, node-failed and boot-failed jobs can be requeued (exit 6 otherwise);
    a running job is cancelled and resubmitted instead.
    """,
    Client.requeue,
)


def cancel(  # noqa: PLR0917 - typer options
    job_ids: Annotated[list[str] | None, typer.Argument(help="job ids")] = None,
    array: Annotated[
        str | None, typer.Option("-a", "--array", help="every unfinished task of this array")
    ] = None,
    reason: Annotated[str | None, typer.Option("--reason", help="why, for the record")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Cancel jobs (like scancel). A running job gets its checkpoint signal and grace first.

    Examples:

      gpupool cancel 3f2a9c1d0b7e

      gpupool cancel 3f2a9c1d0b7e 9a8b7c6d5e4f --reason "wrong data set"

      gpupool cancel --array 5d4c3b2a1f0e        # every task of a job array not yet ended
    """
    if not job_ids and array is None:
        raise fail("nothing to cancel: give job ids, or --array ARRAY_ID")
    with session(server, token) as gp:
        ids = list(job_ids or ())
        if array is not None:
            tasks = gp.list(array=array, state=ACTIVE)
            ids += [t.id for t in sorted(tasks, key=lambda t: t.array_index or 0)]
        _apply(gp, ids, lambda c, job_id: c.cancel(job_id, reason), json_out)


def update(  # noqa: PLR0917 - scontrol-like options
    job_id: Annotated[str, typer.Argument(help="job id")],
    job_name: Annotated[str | None, typer.Option("-J", "--job-name", help="new name")] = None,
    qos: QosOpt = None,
    time_limit: TimeOpt = None,
    expected: ExpectedOpt = None,
    preemptible: PreemptibleOpt = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Change a pending job (like scontrol update): name, priority class, time limits.

    Examples:

      gpupool update 3f2a9c1d0b7e -t 4h

      gpupool update 3f2a9c1d0b7e -q low --expected 30m

    Only jobs that have not started can be changed (exit 6 otherwise); resources, command and
    pool cannot: cancel the job and submit it again.
    """
    changes = {
        "name": job_name,
        "priority": qos,
        "time_limit": time_limit,
        "expected_duration": expected,
        "preemptible": preemptible,
    }
    with session(server, token) as gp:
        job = gp.update(job_id, **changes)
        if json_out:
            print_json(job)
        else:
            typer.echo(
                f"job {job.id} ({job.name}): {job.state}, priority {job.priority_class}, "
                f"time limit {format_duration(job.time_limit_s) if job.time_limit_s else 'none'}"
            )


def install(app: typer.Typer) -> None:
    for command in (cancel, hold, release, requeue, update):
        app.command(name=command.__name__)(command)
