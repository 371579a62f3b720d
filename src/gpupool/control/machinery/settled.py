"""Quiet heartbeats answered from memory: the cheap path of a node with nothing new.

Most heartbeats of a fleet say nothing new: the same replicas in the same states, healthy
devices, and the server has no order for the node. Applying each one in a transaction (a dozen
statements: the node, the epoch, every device's sample, the live assignments, usage, the
orders) cost about 10 ms of server CPU, which a thousand nodes every 5 s could not afford.

Words:

- **settled**: a node whose last heartbeat the server applied in full was answered with no
  start, stop or acknowledgement (resizes allowed: they are level-triggered). The server keeps
  that answer (:class:`Settled`), with what the node reported (a digest of its replicas' states
  and its agent id), this process's order sequence for the node, and the node's
  ``orders_version`` in the store.
- **quiet heartbeat**: one whose replicas digest and agent id equal the settled ones, whose
  devices all report healthy, without an XID and below the temperature alert, while the node's
  order sequence is unchanged and the settled answer is younger than its age limit
  (``max_age_s`` for a node running replicas, ``empty_max_age_s`` for one running none). It is
  answered with the kept answer and no transaction: the node's liveness is written with
  everyone else's once a second (one batched update, as for shed heartbeats; see
  :mod:`~.admission`), its telemetry is kept and written at most every ``telemetry_every_s``
  (sampled, in batches of bounded size), and usage is accrued at the next full heartbeat (it
  counts from the last accrual, so nothing is lost).
- Anything else goes the full way, and so does every heartbeat once the age limit passed, so
  the kept answer never drifts far from the store. A node running replicas is taken the full
  way every two minutes, so that their usage (accrued there) is never more than that behind
  in reports and budgets; an empty node has no usage to accrue and nothing else in its answer
  to refresh (orders and epochs are followed as below, telemetry is sampled), so it goes the
  full way every ten minutes: over a fleet of mostly idle nodes these refreshes were most of
  the full-way heartbeats. Orders given by another process (an API
  worker, another replica) raise the node's ``orders_version`` in the store
  (:func:`~.orders.bump_versions`); every 5 s at most, when it answered quiet heartbeats
  meanwhile, the server reads the versions and drops the settled nodes whose version moved
  (:meth:`SettledNodes.forget_changed`), as it drops them all when the leader epoch changes
  (``control/services/liveness.py``).

In memory, per process, thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpupool.schemas.agent import DeviceTelemetry, HeartbeatRequest, HeartbeatResponse

#: The oldest settled answer given again (seconds): past it the heartbeat goes the full way.
MAX_AGE_S = 120.0
#: The same for a node that reported no replica (nothing to accrue).
EMPTY_MAX_AGE_S = 600.0
#: A quiet node's telemetry is written at most this often (seconds).
TELEMETRY_EVERY_S = 15.0


def digest(req: HeartbeatRequest) -> int:
    """What a heartbeat reports besides telemetry, as one number."""
    return hash((req.epoch, tuple(r.model_dump_json() for r in req.replicas)))


@dataclass(frozen=True)
class Settled:
    digest: int
    agent_id: str | None
    order_seq: int  # this process's order sequence for the node when it was applied
    version: int  # the node's orders_version in that transaction
    epoch: int
    answer: HeartbeatResponse
    at: float  # monotonic
    max_age: float  # seconds


class SettledNodes:
    """See the module docstring."""

    def __init__(
        self,
        max_age_s: float = MAX_AGE_S,
        telemetry_every_s: float = TELEMETRY_EVERY_S,
        empty_max_age_s: float = EMPTY_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_age_s = max_age_s
        self.empty_max_age_s = empty_max_age_s
        self.telemetry_every_s = telemetry_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, Settled] = {}
        self._samples: dict[str, list[DeviceTelemetry]] = {}
        self._sampled_at: dict[str, float] = {}
        self.quiet = 0  # heartbeats answered from memory (for the benchmark and metrics)

    def settle(
        self,
        req: HeartbeatRequest,
        order_seq: int,
        version: int,
        answer: HeartbeatResponse,
    ) -> None:
        """Keep ``answer`` for ``req``'s node, applied in full just now (see the docstring)."""
        entry = Settled(
            digest(req),
            req.agent_id,
            order_seq,
            version,
            answer.epoch,
            answer,
            self._clock(),
            self.max_age_s if req.replicas else self.empty_max_age_s,
        )
        with self._lock:
            self._nodes[req.node] = entry
            self._sampled_at[req.node] = entry.at  # its telemetry was just written

    def forget(self, node: str) -> None:
        with self._lock:
            self._nodes.pop(node, None)

    def answer(self, req: HeartbeatRequest, order_seq: int, hot_c: float) -> Settled | None:
        """The kept answer when ``req`` is quiet (see the docstring), else ``None``."""
        with self._lock:
            entry = self._nodes.get(req.node)
        if entry is None:
            return None
        now = self._clock()
        if (
            now - entry.at > entry.max_age
            or entry.order_seq != order_seq
            or entry.agent_id != req.agent_id
            or not all(_calm(t, hot_c) for t in req.telemetry)
            or entry.digest != digest(req)
        ):
            return None
        with self._lock:
            if self._nodes.get(req.node) is not entry:
                return None
            self.quiet += 1
            if (
                req.telemetry
                and now - self._sampled_at.get(req.node, 0.0) >= self.telemetry_every_s
            ):
                self._samples[req.node] = list(req.telemetry)
                self._sampled_at[req.node] = now
        return entry

    def take_samples(self) -> dict[str, list[DeviceTelemetry]]:
        """Quiet nodes' telemetry kept since the last call (emptied)."""
        with self._lock:
            samples, self._samples = self._samples, {}
            return samples

    def has_samples(self) -> bool:
        return bool(self._samples)

    def versions(self) -> dict[str, tuple[int, int]]:
        """Settled node -> (orders_version, epoch) as kept."""
        with self._lock:
            return {n: (e.version, e.epoch) for n, e in self._nodes.items()}

    def forget_changed(self, current: Mapping[str, int], epoch: int) -> int:
        """Drop settled nodes whose ``orders_version`` in the store is not the kept one (or
        that are gone), and all of them when the epoch moved; returns how many."""
        with self._lock:
            stale = [
                n for n, e in self._nodes.items() if e.epoch != epoch or current.get(n) != e.version
            ]
            for n in stale:
                del self._nodes[n]
            return len(stale)


def _calm(t: DeviceTelemetry, hot_c: float) -> bool:
    """A sample that raises no alert (those take the full way, where alerts are written)."""
    return t.healthy and t.xid is None and (t.temperature_c is None or t.temperature_c < hot_c)
