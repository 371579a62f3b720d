"""Self-fencing: an agent cut off from its server stops its replicas before they run twice.

The server marks a node down after ``node_timeout_s`` of silence and starts its jobs on other
nodes. An agent whose network is cut never hears that, so without a fence its copies keep
running beside the new ones until the link heals (two copies of one job writing the same
checkpoints and outputs). The server tells the agent its node timeout in every answer
(``node_timeout_s``; ``None`` from an older server, which disables the fence); once the agent
has heard nothing from the server for :data:`FENCE_AT` of it, it stops every replica with the
stop reason ``node`` (what the server records for a lost node), the kill due by :data:`KILL_BY`
of it, well before the server can start a second copy.

Words:

- *contact*: any answer from the server, errors included: a 503 while the server's store is
  down (the server does not judge heartbeats it could not record) or a refused connection (the
  server's host answers but its process is restarting, and a restarted server gives every node
  a node timeout of grace). Keeping jobs alive through those is the point of issue 18 item 4.
- *silence*: no answer at all from the server's host (timeouts, no route, network unreachable):
  only silence counts toward the fence.

The fence is checked once per agent tick, so its kill lands in time as long as one request's
timeout is shorter than half the node timeout (10 s against the default 30 s).

**An agent that is gone** (``kill -9``, an OOM kill, a crash, a restart that takes longer than
the node timeout) fences nothing itself, while its replicas' supervisors, made to outlive it,
keep the jobs running; the server marks the node down after its node timeout and starts them
elsewhere: two copies (issue 24 item 7; the netns link-cut test showed none because there the
agent lives and fences). So the agent records every contact in ``contact.json`` in its state
folder (:meth:`Fence.record`, :data:`~gpupool.agent.jobfiles.CONTACT`), and every supervisor
applies the same rule to that record about once a second
(:func:`~gpupool.agent.jobfiles.fence_stop`): an orphaned supervisor stops its job with the
stop reason ``node`` at :data:`FENCE_AT` of the node timeout after the last contact, killed by
:data:`KILL_BY`, exactly when its agent would have. An agent restarted in time makes contact,
renews the record, and its adopted replicas run on.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.jobfiles import CONTACT, FENCE_AT, KILL_BY

__all__ = ["FENCE_AT", "KILL_BY", "Fence"]


@dataclass
class Fence:
    """When this agent last had contact, and whether it has fenced since (see the module)."""

    last_contact: float  # monotonic seconds
    node_timeout_s: float | None = None  # the server's, from its last answer; None: no fence
    fenced: bool = False

    def contact(self, now: float) -> None:
        """The server answered (anything): silence starts again from ``now``."""
        self.last_contact = now
        self.fenced = False

    def record(self, state_dir: Path) -> None:
        """Write that the server answered just now, for the supervisors (see the module
        docstring). The time is the operating system's monotonic clock, not the agent's
        injected one: other processes compare it with theirs. Not made durable: after a node
        crash no supervisor is left to read it."""
        path = state_dir / CONTACT
        tmp = path.with_name(f".{CONTACT}.{os.getpid()}.tmp")
        record = {"monotonic": time.monotonic(), "node_timeout_s": self.node_timeout_s}
        tmp.write_text(json.dumps(record), encoding="ascii")
        os.replace(tmp, path)

    @staticmethod
    def stand_down(state_dir: Path) -> None:
        """Record that no server will start these replicas elsewhere while this agent is away
        (``gpupool up`` stopped: its server stops with it, and a restarted one gives every
        node a node timeout of grace): the supervisors do not fence."""
        path = state_dir / CONTACT
        tmp = path.with_name(f".{CONTACT}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"monotonic": time.monotonic(), "node_timeout_s": None}))
        os.replace(tmp, path)

    def due(self, now: float) -> bool:
        """Whether the replicas must be stopped now (once per stretch of silence)."""
        if self.node_timeout_s is None or self.fenced:
            return False
        return now - self.last_contact >= FENCE_AT * self.node_timeout_s

    def due_in(self, now: float) -> float | None:
        """Seconds until :meth:`due` could first be true (0 when it is); ``None`` while it
        cannot be (no node timeout, or fenced already) until the next contact. A contact only
        puts the moment off, so a watch that sleeps until then misses nothing."""
        if self.node_timeout_s is None or self.fenced:
            return None
        return max(0.0, self.last_contact + FENCE_AT * self.node_timeout_s - now)

    def grace(self, now: float, wanted_s: float) -> float:
        """The grace a replica gets: its own, cut so that the kill lands by :data:`KILL_BY`."""
        assert self.node_timeout_s is not None
        left = self.last_contact + KILL_BY * self.node_timeout_s - now
        return max(0.0, min(wanted_s, left))

    def reason(self, now: float) -> str:
        assert self.node_timeout_s is not None
        return (
            f"no answer from the server for {now - self.last_contact:.0f}s, over half its node "
            f"timeout of {self.node_timeout_s:.0f}s: stopped on this node because the server "
            "starts it elsewhere (check the network between this node and the server)"
        )
