"""Notices between server processes over PostgreSQL ``LISTEN``/``NOTIFY``.

Several ``gpupool server`` replicas (and ``--workers`` processes) share one PostgreSQL store,
and any of them may hold an agent's long poll while another commits the order the agent waits
for. The committing process sends a notice in the same transaction (:func:`publish`:
``pg_notify``, which PostgreSQL delivers only if and when the transaction commits, in commit
order); every process keeps one connection listening on the channel (:class:`Listener`, a
thread of its own) and hands each notice to a callback, which wakes the waiting polls.

Words:

- **payload**: JSON ``[origin, [name, ...]]``: who sent it (a process's own notices are
  skipped by the callback, it has already announced them) and the names (nodes). PostgreSQL
  caps a payload at 8,000 bytes: longer lists go as several notices of at most
  ``MAX_PAYLOAD`` bytes.
- **wake**: a server that does not lead and was poked (a submit, an end, a node registering
  through it) sends its origin on :data:`WAKE_CHANNEL`; the leader wakes its scheduling loop,
  which would otherwise sleep until its next tick (up to a minute when idle).
- **best effort**: a notice lost while a listener reconnects (the store restarted, the
  connection broke) costs only latency: the agent's poll times out and its heartbeat carries
  the order, as with no notices at all. The listener retries with a backoff capped at
  ``RECONNECT_CAP_S`` and blocks in ``notifies`` otherwise (woken every ``WAKE_S`` seconds to
  see whether it should stop: an idle server does not spin).

SQLite has no notices: there one process holds the store, and the in-process board suffices.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

log = logging.getLogger("gpupool.store.notify")

#: The channel new orders for nodes are announced on.
ORDERS_CHANNEL = "gpupool_orders"
#: The channel that wakes the leader's scheduling loop.
WAKE_CHANNEL = "gpupool_wake"
#: Bytes of one notice's payload at most (PostgreSQL refuses 8,000 and more).
MAX_PAYLOAD = 7000
#: The listener's longest wait between reconnection attempts, and between checks for a stop.
RECONNECT_CAP_S = 5.0
WAKE_S = 5.0
_COMPACT = (",", ":")  # JSON without spaces: a name costs its quoted length and a comma


def payloads(origin: str, names: Iterable[str]) -> list[str]:
    """``names`` (sorted) as notices of at most :data:`MAX_PAYLOAD` bytes each."""
    out: list[str] = []
    chunk: list[str] = []
    size = 0
    for name in sorted(set(names)):
        cost = len(json.dumps(name)) + 1
        if chunk and size + cost > MAX_PAYLOAD - len(origin) - 16:
            out.append(json.dumps([origin, chunk], separators=_COMPACT))
            chunk, size = [], 0
        chunk.append(name)
        size += cost
    if chunk:
        out.append(json.dumps([origin, chunk], separators=_COMPACT))
    return out


def parse(payload: str) -> tuple[str, list[str]] | None:
    """A notice's origin and names; ``None`` for anything else (a foreign sender)."""
    try:
        origin, names = json.loads(payload)
    except (ValueError, TypeError):
        return None
    if not isinstance(origin, str) or not isinstance(names, list):
        return None
    return origin, [n for n in names if isinstance(n, str)]


def publish(session: Session, channel: str, origin: str, names: Iterable[str]) -> None:
    """Send ``names`` on ``channel`` when ``session``'s transaction commits (PostgreSQL)."""
    for payload in payloads(origin, names):
        send(session, channel, payload)


def send(session: Session, channel: str, payload: str) -> None:
    """Send ``payload`` on ``channel`` when ``session``'s transaction commits (PostgreSQL)."""
    session.execute(text("SELECT pg_notify(:c, :p)"), {"c": channel, "p": payload})


def conninfo(url: str) -> str:
    """A libpq connection string for the SQLAlchemy ``url`` (``postgresql+psycopg://...``)."""
    plain = make_url(url).set(drivername="postgresql")
    return plain.render_as_string(hide_password=False)


class Listener:
    """One thread holding one connection that ``LISTEN``s on the channels of ``handlers``;
    each notice's payload goes to its channel's handler (called on that thread: keep it
    short)."""

    def __init__(self, url: str, handlers: Mapping[str, Callable[[str], None]]) -> None:
        self._conninfo = conninfo(url)
        self._handlers = dict(handlers)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()  # set while the LISTEN is in force (for tests)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpupool-notify", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening; the thread ends within :data:`WAKE_S` (it is not waited for)."""
        self._stop.set()
        self._thread = None

    def _run(self) -> None:
        # imported here: a SQLite server (gpupool up) never loads the driver (its memory)
        import psycopg

        delay = 0.5
        while not self._stop.is_set():
            try:
                self._listen(psycopg)
                delay = 0.5
            except psycopg.Error as exc:
                self.listening.clear()
                log.warning(
                    "not listening for other servers' orders (%s); retrying in %.1fs: agents "
                    "waiting here get them with their next heartbeat meanwhile",
                    exc,
                    delay,
                )
                self._stop.wait(delay)
                delay = min(RECONNECT_CAP_S, delay * 2)

    def _listen(self, psycopg: Any) -> None:
        with psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=3, keepalives=1, keepalives_idle=30
        ) as conn:
            for channel in self._handlers:
                conn.execute(f'LISTEN "{channel}"')
            self.listening.set()
            while not self._stop.is_set():
                for notice in conn.notifies(timeout=WAKE_S):
                    handler = self._handlers.get(notice.channel)
                    try:
                        if handler is not None:
                            handler(notice.payload)
                    except Exception:  # a bad notice must not end the listener
                        log.exception("could not handle a notice on %s", notice.channel)
                    if self._stop.is_set():
                        break
        self.listening.clear()
