"""What the replay writes down over time, and the integrals the report is computed from.

The cluster's state is a step function of time: it changes only at event instants. The
:class:`Recorder` is given the state after each instant's scheduling cycle; the state holds
until the next instant, so each integral adds ``state x (next instant - this instant)``.

Words:

- **allocated**: milli-GPU held by running (or stopping) jobs.
- **busy GPU**: a device with any slice allocated on it.
- **stranded milli**: free milli-GPU on devices that are partly allocated. A job needing a whole
  device cannot use it; a pool that packs well keeps it low. The **fragmentation ratio** is
  stranded milli over all free milli (0 when nothing is free).
- **demand** of a tenant: milli-GPU it holds plus milli-GPU its pending jobs ask for.
- **entitlement** of a tenant: its max-min fair share of the healthy capacity given every
  tenant's demand and fair-share weight (water-filling: nobody is entitled to more than it
  asks for; what one tenant does not ask for is shared by the others in proportion to weight).
- **normalised share** of a tenant: allocated milli-GPU·s over entitled milli-GPU·s, over the
  whole run. 1.0 means it got exactly its fair share whenever it wanted it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def max_min_shares(
    capacity: float, demands: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Weighted max-min fair shares of ``capacity`` (water-filling over ``demands``).

    Tenants are visited in name order, so the float sums (and the report) are the same in every
    process, whatever its string hash seed."""
    shares = dict.fromkeys(demands, 0.0)
    active = sorted(n for n, d in demands.items() if d > 0)
    left = float(capacity)
    while active and left > 1e-9:
        total_w = sum(weights.get(n, 1.0) for n in active)
        per_w = left / total_w
        capped = [n for n in active if demands[n] - shares[n] <= per_w * weights.get(n, 1.0)]
        if not capped:
            for n in active:
                shares[n] += per_w * weights.get(n, 1.0)
            break
        for n in capped:
            left -= demands[n] - shares[n]
            shares[n] = float(demands[n])
        done = set(capped)
        active = [n for n in active if n not in done]
    return shares


@dataclass(frozen=True)
class TimeSeries:
    """The sampled state, one row per event instant (the state right after its cycle)."""

    time: tuple[float, ...]
    allocated_milli: tuple[int, ...]
    busy_gpus: tuple[int, ...]
    pending_jobs: tuple[int, ...]
    running_jobs: tuple[int, ...]
    stranded_milli: tuple[int, ...]

    def thinned(self, max_points: int) -> TimeSeries:
        """At most about ``max_points`` rows (every k-th row plus the last), for plots and JSON."""
        n = len(self.time)
        if n <= max_points:
            return self
        step = -(-n // max_points)
        idx = [*range(0, n, step)]
        if idx[-1] != n - 1:
            idx.append(n - 1)

        def pick(values: Sequence[float] | Sequence[int]) -> tuple[float, ...]:
            return tuple(values[i] for i in idx)

        return TimeSeries(
            time=pick(self.time),
            allocated_milli=tuple(int(v) for v in pick(self.allocated_milli)),
            busy_gpus=tuple(int(v) for v in pick(self.busy_gpus)),
            pending_jobs=tuple(int(v) for v in pick(self.pending_jobs)),
            running_jobs=tuple(int(v) for v in pick(self.running_jobs)),
            stranded_milli=tuple(int(v) for v in pick(self.stranded_milli)),
        )


@dataclass(frozen=True)
class Integrals:
    """Time integrals over the run (milli-GPU·seconds and seconds)."""

    span_s: float
    allocated_milli_s: float
    busy_gpu_s: float
    capacity_milli_s: float
    stranded_milli_s: float
    free_milli_s: float
    tenant_allocated_milli_s: Mapping[str, float]
    tenant_entitled_milli_s: Mapping[str, float]


class Recorder:
    """Collects samples and integrates them (see the module docstring)."""

    def __init__(self, tenants: Sequence[str], weights: Mapping[str, float]) -> None:
        self._weights = dict(weights)
        self._tenants = tuple(tenants)
        self._time: list[float] = []
        self._alloc: list[int] = []
        self._busy: list[int] = []
        self._pending: list[int] = []
        self._running: list[int] = []
        self._stranded: list[int] = []
        self._last: tuple[float, int, int, int, int, int] | None = None
        self._last_tenant: tuple[dict[str, int], dict[str, float]] = ({}, {})
        self._start: float | None = None
        self._alloc_s = 0.0
        self._busy_s = 0.0
        self._cap_s = 0.0
        self._stranded_s = 0.0
        self._free_s = 0.0
        self._tenant_alloc_s = dict.fromkeys(self._tenants, 0.0)
        self._tenant_ent_s = dict.fromkeys(self._tenants, 0.0)

    def sample(
        self,
        time: float,
        *,
        allocated_milli: int,
        busy_gpus: int,
        pending_jobs: int,
        running_jobs: int,
        stranded_milli: int,
        capacity_milli: int,
        tenant_allocated: Mapping[str, int],
        tenant_demand: Mapping[str, int],
    ) -> None:
        """The state from ``time`` until the next sample."""
        self._advance(time)
        if self._start is None:
            self._start = time
        if self._time and self._time[-1] == time:  # a second cycle at the same instant
            for column in (
                self._time,
                self._alloc,
                self._busy,
                self._pending,
                self._running,
                self._stranded,
            ):
                column.pop()
        self._time.append(time)
        self._alloc.append(allocated_milli)
        self._busy.append(busy_gpus)
        self._pending.append(pending_jobs)
        self._running.append(running_jobs)
        self._stranded.append(stranded_milli)
        self._last = (
            time,
            allocated_milli,
            busy_gpus,
            capacity_milli,
            stranded_milli,
            capacity_milli - allocated_milli,
        )
        entitled = max_min_shares(capacity_milli, tenant_demand, self._weights)
        self._last_tenant = (dict(tenant_allocated), entitled)

    def _advance(self, time: float) -> None:
        if self._last is None:
            return
        t0, alloc, busy, cap, stranded, free = self._last
        dt = time - t0
        if dt <= 0:
            return
        self._alloc_s += alloc * dt
        self._busy_s += busy * dt
        self._cap_s += cap * dt
        self._stranded_s += stranded * dt
        self._free_s += free * dt
        allocated, entitled = self._last_tenant
        for name, value in allocated.items():
            self._tenant_alloc_s[name] = self._tenant_alloc_s.get(name, 0.0) + value * dt
        for name, share in entitled.items():
            self._tenant_ent_s[name] = self._tenant_ent_s.get(name, 0.0) + share * dt
        self._last = (time, alloc, busy, cap, stranded, free)

    def finish(self, end: float) -> tuple[TimeSeries, Integrals]:
        """Close the last interval at ``end`` and return the series and integrals."""
        self._advance(end)
        series = TimeSeries(
            time=tuple(self._time),
            allocated_milli=tuple(self._alloc),
            busy_gpus=tuple(self._busy),
            pending_jobs=tuple(self._pending),
            running_jobs=tuple(self._running),
            stranded_milli=tuple(self._stranded),
        )
        start = self._start if self._start is not None else end
        integrals = Integrals(
            span_s=end - start,
            allocated_milli_s=self._alloc_s,
            busy_gpu_s=self._busy_s,
            capacity_milli_s=self._cap_s,
            stranded_milli_s=self._stranded_s,
            free_milli_s=self._free_s,
            tenant_allocated_milli_s=dict(self._tenant_alloc_s),
            tenant_entitled_milli_s=dict(self._tenant_ent_s),
        )
        return series, integrals
