"""What the server writes, at most once a second, for the heartbeats it did not apply one by one.

Two kinds of heartbeat leave something to write later: shed ones (the server was busy, see
:mod:`~gpupool.control.machinery.admission`) and quiet ones (nothing new, answered from memory,
see :mod:`~gpupool.control.machinery.settled`). :meth:`Liveness.flush`, called at most once a second
by the API process (``api/shedding.py``: ``watch``), writes in a few bounded transactions:

1. when each node was last heard (``NodeService.record_heard``: one batched update; a node at
   most every ``heard_every_s``, 10 s or a quarter of the node timeout: the leader writes all
   of its own before it judges);
2. the telemetry kept from quiet heartbeats (one batched update of the devices, at most
   ``BATCH_ROWS`` rows a transaction);
3. then, when quiet answers were given since and ``REFRESH_S`` passed, it reads every node's
   ``orders_version`` and the leader epoch, and drops the settled nodes whose orders moved in
   another process (or all of them on a new epoch);
4. and it checks the cached tokens in use that are about to run out against the store, in one
   query, and renews them (:func:`~gpupool.control.services.auth.revalidate`), so that the
   quiet heartbeats of nodes with a token each stay on the short way.

Nothing is done, and no transaction opened, while there is nothing to write and no node is
settled (an idle server); :meth:`Liveness.due_in` says when there will be, so the caller may
sleep until then.
"""

from __future__ import annotations

import math
import time

from sqlalchemy import bindparam, select, update

from gpupool.control.context import ControlPlane
from gpupool.control.services.auth import revalidate
from gpupool.control.services.nodes import NodeService, current_epoch
from gpupool.store.models import DeviceModel, NodeModel

#: The most device rows one telemetry transaction updates.
BATCH_ROWS = 2000
#: The least time between two reads of the nodes' ``orders_version`` (seconds).
REFRESH_S = 5.0


class Liveness:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.nodes = NodeService(cp)
        self._quiet_seen = 0  # settled.quiet at the last refresh
        self._refreshed = -math.inf  # monotonic time of the last refresh

    def pending(self) -> bool:
        """Whether :meth:`flush` has anything to do."""
        every = self.nodes.heard_every_s()
        return (
            self.cp.admission.has_heard(every, self.cp.now())
            or self.cp.settled.has_samples()
            or self._refresh_due()
            or self.cp.principals.has_due()
        )

    def due_in(self) -> float | None:
        """Seconds until :meth:`pending` is first true if nothing new happens (0 when it is
        now); ``None``: not before a node is heard or a token used again. For a caller that
        sleeps in between instead of asking once a second (``api/shedding.py``: ``watch``)."""
        if self.cp.settled.has_samples():
            return 0.0
        waits: list[float] = []
        heard = self.cp.admission.heard_due_in(self.nodes.heard_every_s(), self.cp.now())
        if heard is not None:
            waits.append(heard)
        if self.cp.settled.quiet != self._quiet_seen:
            waits.append(max(0.0, REFRESH_S - (time.monotonic() - self._refreshed)))
        tokens = self.cp.principals.due_in()
        if tokens is not None:
            waits.append(tokens)
        return min(waits, default=None)

    def _refresh_due(self) -> bool:
        """Quiet answers were given since the last look at the store's versions, at least
        ``REFRESH_S`` ago."""
        settled = self.cp.settled
        return settled.quiet != self._quiet_seen and time.monotonic() - self._refreshed >= REFRESH_S

    def flush(self) -> tuple[int, int, int]:
        """Write what is pending (see the module docstring); returns (nodes heard, device
        samples written, settled nodes dropped)."""
        heard = self.nodes.record_heard(due_only=True)
        written = self.record_telemetry()
        dropped = self.refresh_settled() if self._refresh_due() else 0
        if self.cp.principals.has_due():
            with self.cp.read() as s:
                revalidate(s, self.cp.principals, self.cp.now())
        return heard, written, dropped

    def record_telemetry(self) -> int:
        samples = self.cp.settled.take_samples()
        if not samples:
            return 0
        now = self.cp.now()
        rows = [
            {
                "u": t.uuid,
                "n": node,
                "util": t.utilization_ratio,
                "mem": t.memory_used_mib,
                "temp": t.temperature_c,
                "power": t.power_w,
                "at": now,
            }
            for node, batch in samples.items()
            for t in batch
        ]
        stmt = (
            update(DeviceModel)
            .where(DeviceModel.uuid == bindparam("u"), DeviceModel.node == bindparam("n"))
            .values(
                utilization_ratio=bindparam("util"),
                memory_used_mib=bindparam("mem"),
                temperature_c=bindparam("temp"),
                power_w=bindparam("power"),
                sampled_at=bindparam("at"),
            )
            .execution_options(synchronize_session=False)
        )
        for start in range(0, len(rows), BATCH_ROWS):
            with self.cp.tx() as s:
                s.connection().execute(stmt, rows[start : start + BATCH_ROWS])
        return len(rows)

    def refresh_settled(self) -> int:
        self._quiet_seen, self._refreshed = self.cp.settled.quiet, time.monotonic()
        if not self.cp.settled.versions():
            return 0
        with self.cp.read() as s:
            current = {
                name: int(version)
                for name, version in s.execute(select(NodeModel.name, NodeModel.orders_version))
            }
            epoch = current_epoch(s)
        return self.cp.settled.forget_changed(current, epoch)
