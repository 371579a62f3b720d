"""The agent's timing: when it beats, how it sleeps, when it stops hearing of the server.

Part of :class:`~gpupool.agent.agent.Agent` (a mixin, as :mod:`gpupool.agent.launch` and
:mod:`gpupool.agent.gpurules` are). The agent's loop (:meth:`Agent.run
<gpupool.agent.agent.Agent.run>`) asks this module three things:

- **pacing**: the wait until the next heartbeat (:meth:`Pacing.spacing`: the server's interval
  while the node has replicas, a third of the node timeout when it has none), the wait after an
  error answer (:meth:`Pacing._retry_wait`: never so long that the fence would count it as
  silence), and how the loop sleeps (:meth:`Pacing._sleep`: an idle node does not poll);
- **the fence's watch**: a thread of its own (a heartbeat to a silent server blocks the loop
  for a whole request timeout) that stops the running replicas after half the node timeout
  of silence (:meth:`Pacing.check_fence`, :mod:`gpupool.agent.fence`); each answer from the
  server is a *contact* (:meth:`Pacing.contact`) that starts the silence again;
- **the long poll**: a thread waiting on the server for new orders (:class:`OrderWaiter`),
  which wakes the loop (``_beat_now``) to heartbeat at once.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol, runtime_checkable

from gpupool.agent.fence import FENCE_AT, Fence
from gpupool.agent.gpurules import GpuRules
from gpupool.agent.jobdir import RUNNING
from gpupool.agent.transport import AgentRejected, Backoff, ServerUnavailable
from gpupool.schemas.agent import OrdersAnswer

log = logging.getLogger("gpupool.agent")

#: Seconds one long poll for new orders waits on the server.
LONG_POLL_S = 25.0
#: The shortest sleep of an idle fence watch (seconds; see :meth:`Pacing._fence_wait`): never
#: a busy loop. (The loop of an agent with no replica sleeps until its next heartbeat.)
IDLE_TICK_S = 1.0
#: An idle agent (no replica, nothing new in its last round) heartbeats every this share of the
#: server's node timeout when that is longer than its interval: three beats per timeout, as
#: Slurm's slurmctld pings a node three times per ``SlurmdTimeout`` (see :meth:`Pacing.spacing`).
IDLE_BEATS_PER_TIMEOUT = 3
#: The longest the fence's watch sleeps on a node with no replica (seconds; see
#: :meth:`Pacing._fence_wait`).
IDLE_FENCE_WAIT_S = 10.0


@runtime_checkable
class OrderWaiter(Protocol):
    """A transport with the long poll (``GET /v1/agent/nodes/{name}/orders``)."""

    def wait_for_orders(self, node: str, since: int, timeout_s: float) -> OrdersAnswer: ...


class Pacing(GpuRules):
    """See the module docstring. The agent provides the attributes declared here."""

    fence: Fence
    backoff: Backoff
    interval_s: float  # the server's heartbeat interval
    _fence_lock: threading.Lock  # orders the fence's checks with contacts
    _fence_nudge: threading.Event  # the node timeout changed: the watch looks again
    _beat_now: threading.Event  # set by the long poll: orders are waiting

    def spacing(self) -> float:
        """The wait until the next heartbeat after one that was answered.

        The server's interval while the node has replicas (their states, exits and GPU use are
        what heartbeats carry, and the fence counts on them) or more to say at once. An idle
        node has nothing to report but that it lives, which the server needs only once per node
        timeout: it beats every ``1/IDLE_BEATS_PER_TIMEOUT`` of it (10 s against the default
        30 s, so two beats may be lost before the node is judged), never more rarely than the
        interval. New orders do not wait for it: the long poll wakes the loop at once."""
        timeout = self.fence.node_timeout_s
        if self.replicas or self._beat_now.is_set() or timeout is None:
            return self.interval_s
        return max(self.interval_s, timeout / IDLE_BEATS_PER_TIMEOUT)

    def _retry_wait(self, retry_after_s: float | None) -> float:
        """The wait before the next try after an error answer: the backoff, at least a busy
        server's ``Retry-After``, but never so long that the fence would count the wait as
        silence: at most a third of the fence's threshold, so two tries land before it."""
        delay = self.backoff.next_delay(retry_after_s)
        timeout = self.fence.node_timeout_s
        if timeout is not None:
            delay = min(delay, FENCE_AT * timeout / 3.0)
        return delay

    def _sleep(self, stop: threading.Event, until_s: float) -> None:
        """Wait for the next round: ``local_tick_s`` while replicas need watching; with none,
        until the next heartbeat (or MPS check) is due, or the long poll's wake-up, or a
        stop (:meth:`_wake_on_stop`), whichever comes first: an idle node does not poll."""
        if self.replicas or self._beat_now.is_set():
            stop.wait(min(self.config.local_tick_s, until_s))
        else:
            self._beat_now.wait(until_s)

    def _wake_on_stop(self, stop: threading.Event) -> None:
        """Wake the loop and the fence's watch when ``stop`` is set: with no replica they
        sleep on their own events (:meth:`_sleep`, :meth:`_watch_fence`), for up to a quiet
        heartbeat's spacing, and see the stop at once this way instead of polling for it."""
        stop.wait()
        self._beat_now.set()
        self._fence_nudge.set()

    def contact(self) -> None:
        """The server answered (anything): the fence's silence starts again, for this agent
        and for its replicas' supervisors (``contact.json``, see agent/fence.py)."""
        with self._fence_lock:
            self.fence.contact(self.clock.monotonic())
            try:
                self.fence.record(self.config.state_dir)
            except OSError as exc:  # a full disk: the supervisors fence as if silent
                log.warning("cannot record the server's contact: %s", exc)

    def _set_node_timeout(self, timeout_s: float | None) -> None:
        if timeout_s != self.fence.node_timeout_s:
            self.fence.node_timeout_s = timeout_s
            self._fence_nudge.set()

    def _watch_fence(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.replicas:
                stop.wait(self.config.local_tick_s)
            else:
                self._fence_nudge.wait(self._fence_wait())
                self._fence_nudge.clear()
            if not stop.is_set():
                self.check_fence()

    def _fence_wait(self) -> float:
        """How long the watch of a node with no replica sleeps: the fence stops replicas, so
        with none it only needs to look again when one could be due, which is no sooner than
        the fence itself could be (:meth:`Fence.due_in`; a new replica comes with a contact,
        which puts that moment off), at least ``IDLE_TICK_S`` and at most
        ``IDLE_FENCE_WAIT_S``; a changed node timeout wakes it at once."""
        left = self.fence.due_in(self.clock.monotonic())
        if left is None:
            return IDLE_FENCE_WAIT_S
        return min(IDLE_FENCE_WAIT_S, max(IDLE_TICK_S, left))

    def check_fence(self) -> bool:
        """Stop every running replica when the server has not answered for half its node
        timeout, because it starts them elsewhere (see :mod:`gpupool.agent.fence`); True when
        it did."""
        with self._fence_lock:
            now = self.clock.monotonic()
            if not self.fence.due(now):
                return False
            reason = self.fence.reason(now)
            self.fence.fenced = True
            running = [
                (key, r.assignment)
                for key, r in list(self.replicas.items())
                if r.observed is not None and r.observed.status == RUNNING
            ]
            if running:
                log.warning("%s: stopping %d replica(s)", reason, len(running))
            for key, a in running:
                grace = self.fence.grace(now, a.grace_period_s)
                self._local_stop(key, "node", reason, a.checkpoint_signal, grace)
            return True

    def _long_poll(self, waiter: OrderWaiter, stop: threading.Event) -> None:
        """Wait on the server for new orders; wake the loop to heartbeat when they come.

        A server without the long poll (an older one) is left alone: heartbeats cover it."""
        seq = -1
        while not stop.is_set():
            try:
                answer = waiter.wait_for_orders(self.config.node, seq, LONG_POLL_S)
            except AgentRejected as exc:
                log.info("no long poll (%s): new orders come with heartbeats", exc)
                return
            except ServerUnavailable:
                stop.wait(1.0)
                continue
            if answer.changed and seq >= 0:
                self._beat_now.set()
            elif not answer.changed and seq == answer.seq:
                stop.wait(0.2)  # answered early with nothing new (a stopping server): no spin
            seq = answer.seq
