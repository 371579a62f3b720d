"""``gpupool priority``: the queue's priority factors, like Slurm's ``sprio``.

One line per pending job, highest priority first (the order the scheduler starts them in, as
far as the priority decides it): its pool, user, tenant and priority class, its priority (the
sum of its factors' contributions) and each factor's contribution, as the scheduler's last
cycle computed them (``GET /v1/priorities``; the factors of
:class:`gpupool.scheduling.ordering.MultiFactor`: the priority class (Slurm's QOS), the job's
size, its age, its tenant's fair share, and how efficiently the pool's GPUs would be used).
``-n`` shows the factors' normalised values (0 to 1) instead, ``-w`` the weights alone. A job
the last cycle did not rank (submitted since, or a server without a scheduler) shows ``-``.
"""

from __future__ import annotations

from typing import Any

import typer

from gpupool.cli.fit import Cut, FitTable
from gpupool.cli.options import COMMON, Opt, Param
from gpupool.cli.session import emit, print_json, session
from gpupool.cli.typed import command
from gpupool.schemas.priority import PriorityRow

#: Slurm's column name for each of gpupool's factors (others: the factor's name in capitals).
SLURM_NAMES = {
    "priority": "QOS",
    "size": "JOBSIZE",
    "age": "AGE",
    "fairshare": "FAIRSHARE",
    "efficiency": "EFFICIENCY",
}

PRIORITY: tuple[Param, ...] = (
    Opt("user", ("-u", "--user"), "only this user's jobs"),
    Opt("account", ("-A", "--account"), "only this tenant's jobs"),
    Opt("pool", ("-p", "--pool"), "only this pool's jobs"),
    Opt("norm", ("-n", "--norm"), "each factor's normalised value (0-1), not weighted", kind=bool),
    Opt("weights", ("-w", "--weights"), "the weight of each factor, nothing else", kind=bool),
    *COMMON,
)

HELP = """Show the priority factors of every pending job, highest first (like sprio).

    Examples:

      gpupool priority

      gpupool priority -u alice -p research

      gpupool priority -n          # normalised values (0 to 1) instead of contributions

      gpupool priority -w          # the weights the scheduler uses

    PRIORITY is the sum of the factors' contributions (weight x value), as the scheduler's
    last cycle computed them: QOS (the priority class), JOBSIZE, AGE, FAIRSHARE (the tenant's
    use against its share) and EFFICIENCY (how well the job fits the pool's GPUs). Jobs the
    last cycle did not rank yet show -. gpupool show
    JOB explains one job's factors.
    """


def _factor_names(rows: list[PriorityRow]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        for f in row.factors or ():
            names.setdefault(f.name, None)
    return list(names)


def priority_table(rows: list[PriorityRow], norm: bool = False) -> FitTable:
    """``gpupool priority``'s table: the jobs' contributions (``norm``: values) per factor."""
    names = _factor_names(rows)
    columns = [SLURM_NAMES.get(n, n.upper()) for n in names]
    t = FitTable(
        ["JOBID", "POOL", "USER", "TENANT", "CLASS", "PRIORITY", *columns],
        right=["PRIORITY", *columns],
        moves=[Cut("USER", 8), Cut("TENANT", 8), Cut("POOL", 8)],
    )
    for row in rows:
        by_name = {f.name: f for f in row.factors or ()}
        cells = [
            f"{by_name[n].value if norm else by_name[n].contribution:.3f}" if n in by_name else "-"
            for n in names
        ]
        total = "-" if row.priority is None else f"{row.priority:.3f}"
        t.add_row(row.id, row.pool, row.user, row.tenant, row.priority_class, total, *cells)
    return t


def weights_table(rows: list[PriorityRow]) -> FitTable:
    """``gpupool priority -w``: each factor's weight (sprio -w)."""
    names = _factor_names(rows)
    t = FitTable(["FACTOR", "WEIGHT", "MEANING"], right=["WEIGHT"])
    for name in names:
        f = next(f for r in rows for f in r.factors or () if f.name == name)
        t.add_row(SLURM_NAMES.get(name, name.upper()), f"{f.weight:.3f}", f.meaning)
    return t


def _priority(params: dict[str, Any]) -> None:
    with session(params["server"], params["token"]) as gp:
        answer = gp.priorities(user=params["user"], tenant=params["account"], pool=params["pool"])
    if params["json_out"]:
        print_json(answer.jobs)
        return
    rows = list(answer.jobs)
    if params["weights"]:
        if not any(r.factors for r in rows):
            typer.echo("no pending job was ranked by factors: no weights to show", err=True)
            return
        emit(weights_table(rows))
        return
    emit(priority_table(rows, norm=params["norm"]))


priority = command("priority", HELP, PRIORITY, _priority)


def install(app: typer.Typer) -> None:
    app.command(name="priority")(priority)
