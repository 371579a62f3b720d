"""Why is my job where it is? Text for people, built only from a decision.

:func:`explain_job` answers for one job: started (where), or pending (the reason, the message,
the estimated start), plus its priority factor table and its place in the queue.
:func:`factor_rows` gives the table as plain rows for the CLI and the web page to render.
Times are shown relative to the decision's ``now`` (``in 25m``) because the scheduler has no
wall clock; the caller formats absolute times if it wants them.
"""

from __future__ import annotations

from gpupool.domain.units import format_duration
from gpupool.scheduling.decision import Decision, PriorityFactors


def factor_rows(table: PriorityFactors) -> list[tuple[str, str, str, str, str]]:
    """``(factor, weight, value, contribution, meaning)`` rows, then a ``score`` row."""
    rows = [
        (f.name, f"{f.weight:.2f}", f"{f.value:.3f}", f"{f.contribution:.3f}", f.meaning)
        for f in table.factors
    ]
    rows.append(("score", "", "", f"{table.score:.3f}", "sum of contributions"))
    return rows


def _when(estimate: float | None, now: float) -> str:
    if estimate is None:
        return "unknown"
    if estimate <= now:
        return "now"
    return f"in {format_duration(estimate - now)}"


def explain_job(decision: Decision, job_id: str, now: float) -> str:
    """A few lines on ``job_id``: outcome, reason, estimate, queue position and factor table."""
    lines: list[str] = []
    start = decision.start_of(job_id)
    if start is not None:
        where = "; ".join(
            f"rank {r.rank} on {r.node} ({', '.join(r.devices) or 'no GPU'})"
            for r in start.replicas
        )
        terms = "borrowing idle capacity (reclaimable)" if start.borrowing else "in quota"
        lines.append(f"job {job_id}: starts now, {terms}: {where}")
    elif job_id in decision.pending:
        info = decision.pending[job_id]
        lines.append(f"job {job_id}: pending ({info.reason.value}): {info.message}")
        lines.append(f"estimated start: {_when(info.estimated_start, now)}")
        victims = [p for p in decision.preemptions if p.for_job == job_id]
        for p in victims:
            lines.append(f"preempting {p.victim} ({p.reason.value}): {p.message}")
    else:
        return f"job {job_id}: not in this scheduling cycle (not pending, or already running)"
    if job_id in decision.order:
        position = decision.order.index(job_id) + 1
        lines.append(f"queue position: {position} of {len(decision.order)}")
    table = decision.priorities.get(job_id)
    if table is not None and table.factors:
        width = max(len(f.name) for f in table.factors)
        for name, weight, value, contribution, meaning in factor_rows(table):
            lines.append(
                f"  {name:<{width}}  {weight:>4}  {value:>5}  {contribution:>5}  {meaning}"
            )
    return "\n".join(lines)
