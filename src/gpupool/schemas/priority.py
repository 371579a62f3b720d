"""The queue's priority table (``GET /v1/priorities``, ``gpupool priority``: Slurm's ``sprio``).

Each pending job the caller may see, with the factor table the scheduler ranked it by in its
last cycle (the ordering stage of :mod:`gpupool.scheduling.ordering`: the same numbers that
decided the order, not recomputed): each factor's weight, normalised value (0 to 1) and
contribution (weight x value), and their sum, the job's priority. ``factors`` is ``None`` for a
job the last cycle did not rank (submitted since, or no scheduler running in this server).
"""

from __future__ import annotations

from gpupool.schemas.base import WireModel
from gpupool.schemas.jobs import FactorView


class PriorityRow(WireModel):
    id: str
    name: str
    user: str
    tenant: str
    pool: str
    priority_class: str
    priority: float | None  # the sum of the contributions; None: not ranked
    factors: list[FactorView] | None


class PriorityList(WireModel):
    jobs: list[PriorityRow]  # highest priority first, the unranked last (by submit time)
