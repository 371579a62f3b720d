"""Named scenarios: one scheduler configuration plus how the workload is presented to it.

A scenario never adds code to the scheduler: it is a :class:`~gpupool.scheduling.config.
SchedulerConfig` (stage names from the scheduler's registries) and two workload switches.

Words:

- **whole GPUs**: every fractional request is rounded up to one whole device before the replay
  (:meth:`~gpupool.sim.workload.TraceJob.rounded_up`): what teams do without a pool.
- **equal quotas**: when the trace does not say who owns what, every tenant is guaranteed an
  equal part of the cluster and borrows the idle rest
  (:func:`~gpupool.sim.workload.equal_quotas`). A trace that defines quotas keeps its own.

Built-in scenarios (:data:`SCENARIOS`):

- ``static``: the private rooms the seeds start from: each team owns its part of the cluster
  (its guaranteed share, else an equal part; :mod:`gpupool.sim.rooms`) and its jobs run only
  there, whole GPUs, FIFO per room, no sharing, no borrowing, no preemption.
- ``exclusive``: whole GPUs, FIFO order, best-fit placement, no quotas, no preemption, no
  backfill (a blocked job at the head of the queue blocks everyone behind it).
- ``pooled``: fractional slices, the placement registry's default (fragmentation-aware) policy,
  multi-factor priorities, quotas with borrowing, preemption and EASY backfill.
- ``pooled-nopreempt``, ``pooled-bestfit``, ``pooled-spread``, ``pooled-fifo``,
  ``exclusive-backfill``: one switch changed each, to see what each part buys.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpupool.domain.errors import InvalidValue
from gpupool.scheduling.config import SchedulerConfig


@dataclass(frozen=True)
class Scenario:
    """A named way of running the cluster."""

    name: str
    description: str
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    whole_gpus: bool = False
    equal_quotas: bool = True
    static: bool = False

    def with_placement(self, policy: str) -> Scenario:
        """The same scenario with another placement policy (named ``<name>+<policy>``)."""
        return replace(
            self,
            name=f"{self.name}+{policy}",
            config=replace(self.config, default_placement=policy),
        )


# Whole GPUs leave nothing to fragment: plain best fit (which learns nothing, so a cycle does
# not gather the queue's shapes for it).
_EXCLUSIVE_CONFIG = SchedulerConfig(
    ordering="fifo",
    admission="none",
    preemption_enabled=False,
    backfill="strict",
    default_placement="bestfit",
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "exclusive",
            "whole GPUs, FIFO, best fit, no quotas, no preemption, no backfill",
            _EXCLUSIVE_CONFIG,
            whole_gpus=True,
            equal_quotas=False,
        ),
        Scenario(
            "static",
            "each team on its own GPUs (a room each): whole GPUs, FIFO per room, no sharing",
            _EXCLUSIVE_CONFIG,
            whole_gpus=True,
            equal_quotas=False,
            static=True,
        ),
        Scenario(
            "exclusive-backfill",
            "whole GPUs, FIFO, EASY backfill",
            replace(_EXCLUSIVE_CONFIG, backfill="easy"),
            whole_gpus=True,
            equal_quotas=False,
        ),
        Scenario(
            "pooled",
            "fractional slices, default placement, priorities, quotas, preemption, backfill",
        ),
        Scenario(
            "pooled-nopreempt",
            "pooled without preemption",
            SchedulerConfig(preemption_enabled=False),
        ),
        Scenario(
            "pooled-bestfit",
            "pooled with best-fit placement",
            SchedulerConfig(default_placement="bestfit"),
        ),
        Scenario(
            "pooled-spread",
            "pooled with spread placement",
            SchedulerConfig(default_placement="spread"),
        ),
        Scenario(
            "pooled-fifo",
            "pooled with FIFO ordering",
            SchedulerConfig(ordering="fifo"),
        ),
    )
}


def scenario_names() -> tuple[str, ...]:
    return tuple(SCENARIOS)


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ``pooled+spread`` picks a placement policy for it."""
    base, _, policy = name.partition("+")
    found = SCENARIOS.get(base)
    if found is None:
        raise InvalidValue(
            f"scenario {name!r} is not known: use one of {', '.join(SCENARIOS)} "
            "(add +POLICY to choose a placement policy, e.g. pooled+spread)",
            field="scenario",
        )
    return found.with_placement(policy) if policy else found
