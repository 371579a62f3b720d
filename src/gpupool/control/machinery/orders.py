"""New orders for a node, announced in process (the agent's long poll).

Words:

- **order sequence** (``seq``): a per-node counter, bumped whenever this server commits a start
  or a stop for the node. An agent waits (``GET /v1/agent/nodes/{name}/orders?since=seq``) until
  it grows past what it saw, then heartbeats at once to fetch the orders.

Each server process keeps its own counters. On PostgreSQL the process that commits an order
also sends a notice (``store/notify.py``, ``ControlPlane.tx``), and every other process (another
replica, another ``--workers`` process) announces the nodes on its own board when the notice
arrives, so an agent long-polling any replica hears at once; a notice lost while a listener
reconnects only costs latency (the poll times out, the heartbeat delivers the orders). An agent
that moves to another replica starts again from ``since=-1`` (the counters differ). Waiters are
asyncio events (one per waiting request, no thread held); :meth:`OrderBoard.announce` may be
called from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable

from sqlalchemy import update
from sqlalchemy.orm import Session

from gpupool.store.models import NodeModel

#: ``Session.info`` key: nodes given a start or stop in this transaction (see :func:`mark`).
ORDER_NODES = "gpupool.order_nodes"


def mark(session: Session, nodes: Iterable[str]) -> None:
    """Note that this transaction gives ``nodes`` new orders; announced after its commit."""
    session.info.setdefault(ORDER_NODES, set()).update(nodes)


def bump_versions(session: Session) -> None:
    """Before commit: raise the ``orders_version`` of the nodes :func:`mark` noted, so every
    server process sees that those nodes have something new (see ``machinery/settled.py``)."""
    nodes = session.info.get(ORDER_NODES)
    if nodes:
        session.execute(
            update(NodeModel)
            .where(NodeModel.name.in_(sorted(nodes)))
            .values(orders_version=NodeModel.orders_version + 1)
            .execution_options(synchronize_session=False)
        )


class OrderBoard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq: dict[str, int] = {}
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._closing = False

    def seq(self, node: str) -> int:
        with self._lock:
            return self._seq.get(node, 0)

    def announce(self, nodes: Iterable[str]) -> None:
        """New orders for ``nodes`` were committed: wake their waiting agents."""
        with self._lock:
            woken: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
            for node in set(nodes):
                self._seq[node] = self._seq.get(node, 0) + 1
                woken.extend(self._waiters.get(node, ()))
        for loop, event in woken:
            loop.call_soon_threadsafe(event.set)

    def release_all(self) -> None:
        """Answer every waiting long poll now (the server is stopping): each gets its node's
        current sequence, so its agent simply asks again, of the next server. Polls that
        arrive after this (on a kept-alive connection) answer at once too."""
        with self._lock:
            self._closing = True
            woken = [entry for waiting in self._waiters.values() for entry in waiting]
        for loop, event in woken:
            loop.call_soon_threadsafe(event.set)

    async def wait(self, node: str, since: int, timeout_s: float) -> int:
        """The node's sequence once it is above ``since``, or after ``timeout_s``."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            current = self._seq.get(node, 0)
            if current > since or self._closing:
                return current
            self._waiters.setdefault(node, set()).add(entry)
        try:
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            pass
        finally:
            with self._lock:
                waiting = self._waiters.get(node)
                if waiting is not None:
                    waiting.discard(entry)
                    if not waiting:
                        del self._waiters[node]
        return self.seq(node)
