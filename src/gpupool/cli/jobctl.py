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

cancel, hold and release take job ids (a job array's id stands for its tasks) and/or filters
(``-u`` user, ``-n`` name, ``-t`` state, ``-a`` array, ``-A`` account, ``-p`` pool) and change
every job selected in ONE request and one transaction (``POST /v1/jobs/bulk``, see
:mod:`gpupool.control.services.bulk`); an id that matches nothing is exit 3, a job named by id
that the action leaves alone (an ended job for cancel, a running one for hold) exit 6, and the
other jobs are changed all the same. requeue takes job ids and changes them one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from gpupool.cli import hotjobs
from gpupool.cli.options import CANCEL
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
from gpupool.cli.typed import command as typed_command
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


# ----------------------------------------------------------------- by selection (one request)

JobIdsOpt = Annotated[
    list[str] | None, typer.Argument(help="job ids, or job array ids for all their tasks")
]
UserOpt = Annotated[str | None, typer.Option("-u", "--user", help="only this user's jobs")]
NameOpt = Annotated[str | None, typer.Option("-n", "--name", help="only jobs of this name")]
StateOpt = Annotated[
    list[str] | None,
    typer.Option("-t", "--state", help="only these states (names or codes, repeat)"),
]
ArrayOpt = Annotated[
    str | None, typer.Option("-a", "--array", help="only the tasks of this job array")
]
AccountOpt = Annotated[str | None, typer.Option("-A", "--account", help="only this tenant's jobs")]
PoolOpt = Annotated[str | None, typer.Option("-p", "--pool", help="only jobs of this pool")]

CANCEL_HELP = """Cancel jobs (like scancel), by id and/or filter, in one request. A running job gets
    its checkpoint signal and grace first.

    Examples:

      gpupool cancel 3f2a9c1d0b7e

      gpupool cancel 3f2a9c1d0b7e 9a8b7c6d5e4f --reason "wrong data set"

      gpupool cancel 5d4c3b2a1f0e                # an array id: every task not yet ended

      gpupool cancel -u alice -t PENDING         # all of alice's pending jobs

      gpupool cancel -n sweep -t PD -t R         # by name, pending and running

    Filters narrow together; without -t every unfinished job they match is cancelled.
    """

cancel = typed_command("cancel", CANCEL_HELP, CANCEL, hotjobs.cancel)


def _hold_command(action: str, doc: str) -> Callable[..., None]:
    def command(  # noqa: PLR0917 - scontrol-like options
        job_ids: JobIdsOpt = None,
        user: UserOpt = None,
        name: NameOpt = None,
        array: ArrayOpt = None,
        account: AccountOpt = None,
        pool: PoolOpt = None,
        server: ServerOpt = None,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        if not job_ids and not any((user, name, array, account, pool)):
            raise fail(f"nothing to {action}: give job ids, or a filter (-u, -n, -a, -A, -p)")
        given = {"job_ids": job_ids, "user": user, "name": name, "array": array}
        given |= {"account": account, "pool": pool, "server": server, "token": token}
        hotjobs.select(action, {**given, "json_out": json_out})

    command.__name__ = action
    command.__doc__ = doc
    return command


hold = _hold_command(
    "hold",
    """Keep pending jobs from starting until they are released (like scontrol hold).

    Examples:

      gpupool hold 3f2a9c1d0b7e

      gpupool hold -u alice -n sweep        # all of alice's pending jobs named sweep

    Only pending jobs can be held (exit 6 for one named by id that is not); gpupool queue
    shows them with reason JobHeld. Jobs are held in one request.
    """,
)
release = _hold_command(
    "release",
    """Let held jobs start again (like scontrol release).

    Examples:

      gpupool release 3f2a9c1d0b7e

      gpupool release -u alice             # every held job of alice

    The job keeps its place: its queue order still counts from when it became eligible.
    """,
)


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
