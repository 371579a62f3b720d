"""The agents' last acknowledged reports, to expand delta heartbeats to full states.

An agent that numbers its heartbeats (``seq``) sends, once the server acknowledged one
(``ack_seq``), only the replicas whose report changed since (``base``: the report it is a
delta against; see :class:`~gpupool.schemas.agent.HeartbeatRequest`). :class:`ReportBook`
keeps, per node, the full replica reports as of the last heartbeat this process applied or
answered, and :meth:`ReportBook.expand` turns a delta back into the full state, so everything
after it (the quiet path, the transaction) sees the full state as rule 1 of the protocol
says. When the book does not hold the delta's base (this process restarted, another replica
answered the last heartbeat, the agent changed) the answer is ``want_full``: the agent sends
its full state at once. Replicas the server acknowledged as finished leave the book, as they
leave the agent.

In memory, per process, thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gpupool.schemas.agent import HeartbeatRequest, HeartbeatResponse, ReplicaStatus


@dataclass(frozen=True)
class _Entry:
    seq: int
    agent_id: str | None
    replicas: dict[str, ReplicaStatus]


class ReportBook:
    """See the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, _Entry] = {}

    def expand(self, req: HeartbeatRequest) -> HeartbeatRequest | None:
        """``req`` as a full state (itself when it is one); ``None`` when its base is not
        held here (answer ``want_full``)."""
        if req.seq is None or req.base is None:
            return req
        with self._lock:
            entry = self._nodes.get(req.node)
        if entry is None or entry.seq != req.base or entry.agent_id != req.agent_id:
            return None
        merged = dict(entry.replicas)
        merged.update((r.assignment_id, r) for r in req.replicas)
        return req.model_copy(update={"replicas": [merged[k] for k in sorted(merged)]})

    def applied(self, req: HeartbeatRequest, answer: HeartbeatResponse) -> None:
        """``req`` (a full state) was applied or answered with ``answer``: keep it as the
        node's acknowledged report (when the agent numbers its reports)."""
        if req.seq is None or not answer.registered:
            with self._lock:
                self._nodes.pop(req.node, None)
            return
        done = set(answer.finished_ack)
        kept = {r.assignment_id: r for r in req.replicas if r.assignment_id not in done}
        with self._lock:
            self._nodes[req.node] = _Entry(req.seq, req.agent_id, kept)

    def forget(self, node: str) -> None:
        with self._lock:
            self._nodes.pop(node, None)
