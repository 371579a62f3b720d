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
"""

from __future__ import annotations

from dataclasses import dataclass

#: Share of the server's node timeout of silence after which the agent stops its replicas.
FENCE_AT = 0.5
#: Share of the node timeout by which the stopped replicas are killed (the grace is cut to fit).
KILL_BY = 0.75


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

    def due(self, now: float) -> bool:
        """Whether the replicas must be stopped now (once per stretch of silence)."""
        if self.node_timeout_s is None or self.fenced:
            return False
        return now - self.last_contact >= FENCE_AT * self.node_timeout_s

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
