"""Commands that change jobs in the queue, like Slurm's ``scancel`` and ``scontrol hold |
release | requeue | update``.

- **cancel**: stop jobs (a running one gets its checkpoint signal and grace), by id or every
  unfinished task of a job array.
- **hold**: a pending job stays in the queue but is not considered until released (reason
  ``Held``); only pending jobs can be held.
- **release**: the job is considered again from the next scheduling cycle.
- **requeue**: a job that ended without finishing its work (failed, preempted, its node failed,
  it could not boot) goes back to the queue as pending, keeping its id, spec and history.
- **update**: a pending job's name, priority class, time limit, expected run time,
  preemptibility or resources change (see :mod:`gpupool.control.services.jobedit`), checked
  as a submit is checked.

cancel, hold and release take job ids (a job array's id stands for its tasks) and/or filters
(``-u`` user, ``-n`` name, ``-t`` state, ``-a`` array, ``-A`` account, ``-p`` pool) and change
every job selected in ONE request and one transaction (``POST /v1/jobs/bulk``, see
:mod:`gpupool.control.services.bulk`); an id that matches nothing is exit 3, a job named by id
that the action leaves alone (an ended job for cancel, a running one for hold) exit 6, and the
other jobs are changed all the same. requeue takes job ids and changes them one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from gpupool.cli import hotjobs, render
from gpupool.cli.options import CANCEL, UPDATE
from gpupool.cli.out import OPTION_NAMES
from gpupool.cli.session import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    fail,
    print_json,
    session,
)
from gpupool.cli.typed import command as typed_command
from gpupool.client.sdk import Client
from gpupool.domain.errors import InvalidValue
from gpupool.domain.units import format_duration, parse_cpus, parse_gpus, parse_memory
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


UPDATE_HELP = """Change a pending job (like scontrol update): name, priority class, time
    limits, and its resources, checked as a submit is checked.

    Examples:

      gpupool update 3f2a9c1d0b7e -t 4h

      gpupool update 3f2a9c1d0b7e -q low --expected 30m

      gpupool update 3f2a9c1d0b7e -g 2 --gpu-mem 40GiB --mem 64GiB

    New resources are laid over the job's own (-g 2 keeps its --gpu-mem) and refused as a
    submit would refuse them: a bad value, more than any node of its pool holds, past its
    tenant's quota (exit 2; nothing changes). Only jobs that have not started can be changed
    (exit 6 otherwise; a running shim job's slice: gpupool resize); command, pool and replicas
    cannot: cancel the job and submit it again. Every change is audited (job.update).
    """

#: ``update``'s resource options and the job-file key each sets.
_RESOURCE_KEYS = {
    "gpus": ("gpus", parse_gpus),
    "gpu_mem": ("gpu_memory", lambda v: parse_memory(v, field="gpu memory")),
    "cpus": ("cpus", parse_cpus),
    "mem": ("memory", lambda v: parse_memory(v, field="memory")),
}


def _update(params: dict[str, Any]) -> None:
    resources: dict[str, Any] = {}
    for dest, (key, parse) in _RESOURCE_KEYS.items():
        value = params[dest]
        if value is None:
            continue
        try:  # refused here, with the option's name, as submit refuses it
            parse(value)
        except InvalidValue as exc:
            raise fail(f"{OPTION_NAMES[f'resources.{key}']}: {exc.message}") from None
        resources[key] = value
    if params["gpu_type"]:
        resources["gpu_types"] = "|".join(params["gpu_type"])
    changes = {
        "name": params["job_name"],
        "priority": params["qos"],
        "time_limit": params["time_limit"],
        "expected_duration": params["expected"],
        "preemptible": params["preemptible"],
        "resources": resources or None,
    }
    with session(params["server"], params["token"]) as gp:
        job = gp.update(params["job_id"], **changes)
        if params["json_out"]:
            print_json(job)
        else:
            typer.echo(
                f"job {job.id} ({job.name}): {job.state}, priority {job.priority_class}, "
                f"time limit {format_duration(job.time_limit_s) if job.time_limit_s else 'none'}"
                + (f", GPU slice {render.gpu_slice(job)}" if resources else "")
            )


update = typed_command("update", UPDATE_HELP, UPDATE, _update)


def install(app: typer.Typer) -> None:
    for command in (cancel, hold, release, requeue, update):
        app.command(name=command.__name__)(command)
