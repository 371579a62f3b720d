"""Quotas for a replay from the command line (``--quota TEAM=GUARANTEED[:LIMIT]``, in GPUs).

A team named here gets exactly this quota in the replay (``pooled`` scenarios: guaranteed and
borrowing up to the limit; ``static``: the size of its room); a team not named keeps what the
trace gave it. Without any quota from the trace or here, ``pooled`` scenarios guarantee every
team an equal part (:func:`gpupool.sim.workload.equal_quotas`); once some are given, a team
named by neither has no quota (unmanaged: never borrowing, never limited), as on a server.

Nothing is written anywhere: the quotas live in the replay's workload only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpupool.domain.errors import InvalidValue
from gpupool.domain.pools import DEFAULT_POOL
from gpupool.domain.tenants import Quota
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.sim.workload import SimCluster, Workload

_USAGE = "use --quota TEAM=GUARANTEED[:LIMIT] in GPUs, e.g. --quota vision=8:16 or nlp=4"


def _gpus(text: str, what: str, item: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise InvalidValue(f"--quota {item!r}: {what} {text!r} is not a number: {_USAGE}") from None
    if not value >= 0 or value == float("inf"):
        raise InvalidValue(f"--quota {item!r}: {what} must be 0 or more GPUs: {_USAGE}")
    return round(value * MILLI_PER_GPU)


def parse_quotas(items: Sequence[str]) -> dict[str, tuple[int, int | None]]:
    """``["vision=8:16", "nlp=4"]`` -> ``{"vision": (8000, 16000), "nlp": (4000, None)}``."""
    found: dict[str, tuple[int, int | None]] = {}
    for item in items:
        team, sep, amounts = item.partition("=")
        team = team.strip()
        if not sep or not team or not amounts.strip():
            raise InvalidValue(f"--quota {item!r} is not TEAM=GUARANTEED[:LIMIT]: {_USAGE}")
        guaranteed_text, _, limit_text = amounts.partition(":")
        guaranteed = _gpus(guaranteed_text.strip(), "the guarantee", item)
        limit = _gpus(limit_text.strip(), "the limit", item) if limit_text.strip() else None
        if limit is not None and limit < guaranteed:
            raise InvalidValue(
                f"--quota {item!r}: the limit is below the guarantee: give LIMIT >= GUARANTEED"
            )
        if team in found:
            raise InvalidValue(f"--quota names team {team!r} twice: keep one")
        found[team] = (guaranteed, limit)
    return found


def apply_quotas(
    workload: Workload, cluster: SimCluster, quotas: dict[str, tuple[int, int | None]]
) -> Workload:
    """``workload`` with the quotas of ``quotas`` (see the module docstring); refuses a team the
    trace does not have and guarantees above the cluster."""
    if not quotas:
        return workload
    known = set(workload.tenant_names)
    unknown = sorted(set(quotas) - known)
    if unknown:
        raise InvalidValue(
            f"--quota names {', '.join(unknown)}, not a team of this trace: its teams are "
            + ", ".join(sorted(known)),
            field="quota",
        )
    kept = {q.tenant: q for q in workload.quotas if q.tenant not in quotas}
    given = {
        team: Quota(tenant=team, pool=DEFAULT_POOL, guaranteed_milli=g, limit_milli=limit)
        for team, (g, limit) in quotas.items()
    }
    merged = {**kept, **given}
    total = sum(q.guaranteed_milli for q in merged.values())
    if total > cluster.capacity_milli:
        raise InvalidValue(
            f"the guarantees add up to {total / MILLI_PER_GPU:g} GPUs, the cluster has "
            f"{cluster.gpu_count}: lower some --quota",
            field="quota",
        )
    ordered = tuple(merged[t] for t in workload.tenant_names if t in merged)
    return replace(workload, quotas=ordered)
