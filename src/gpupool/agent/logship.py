"""Shipping replica logs to the server (``POST /v1/agent/logs``).

The agent's **log shipper** remembers, per assignment and stream, the **node offset** (bytes of
the replica's ``stdout.log`` / ``stderr.log`` the server has) and sends what was appended since,
in chunks of at most ``LOG_CHUNK_MAX_BYTES``. The server answers the offset it wants next, so
after an agent restart (offsets forgotten, starting at 0) it skips what it already has. A replica
the agent has forgotten (moved to ``done/``) is shipped to its end, then dropped. Shipping is
best effort: an unreachable server only delays it; the job never waits for it.

Once the replica has ended (its ``state.json`` beside the logs says so; the supervisor writes
that only after its log pumps reached the end of the job's pipes), the chunk that reaches the
end of a file carries ``final`` (an empty one when nothing was left), so the server and the
clients following the log know nothing more will come, rather than guessing from a quiet poll.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from gpupool.agent.jobdir import JobDir
from gpupool.schemas.agent import LOG_CHUNK_MAX_BYTES, LogAck, LogChunkRequest, LogStream

log = logging.getLogger("gpupool.agent.logs")

#: Chunks sent per stream in one round (the rest follow in the next round): 8 MiB, so a job
#: writing fast is followed closely without one round holding the agent's loop for long.
MAX_CHUNKS_PER_ROUND = 32


@runtime_checkable
class LogSink(Protocol):
    """Where chunks go (the HTTP transport implements it)."""

    def ship_logs(self, chunk: LogChunkRequest) -> LogAck: ...


class LogShipper:
    """See the module docstring. ``path_of(key, stream)`` finds a replica's log file."""

    def __init__(
        self,
        sink: LogSink,
        path_of: Callable[[str, str], Path | None],
        chunk_bytes: int = LOG_CHUNK_MAX_BYTES,
    ) -> None:
        self.sink = sink
        self.path_of = path_of
        self.chunk_bytes = max(1, min(chunk_bytes, LOG_CHUNK_MAX_BYTES))
        self.offsets: dict[tuple[str, LogStream], int] = {}
        self._draining: set[str] = set()
        self._refused: set[str] = set()
        self._finished: set[tuple[str, LogStream]] = set()  # streams whose end was sent

    def track(self, key: str) -> None:
        """Ship this replica from now on (also once it is forgotten, to the end of its logs)."""
        for stream in LogStream:
            self.offsets.setdefault((key, stream), 0)

    def ship(self, live: Iterable[str]) -> int:
        """Send new bytes of the ``live`` replicas and of forgotten ones not yet shipped to
        their end. Returns the bytes sent. Transport errors propagate (the caller retries)."""
        live = set(live)
        known = {key for key, _ in self.offsets}
        self._draining |= known - live
        sent = 0
        for key in sorted(live | self._draining):
            if key in self._refused:
                if key in self._draining:
                    self._refused.discard(key)
                    self._forget(key)
                continue
            complete = True
            for stream in LogStream:
                n, done = self._ship_stream(key, stream)
                sent += n
                complete = complete and done
            if key in self._draining and complete:
                self._forget(key)
        return sent

    def _ship_stream(self, key: str, stream: LogStream) -> tuple[int, bool]:
        """Ship what is new in one stream; returns (bytes sent, reached its current end)."""
        if (key, stream) in self._finished:
            return 0, True
        path = self.path_of(key, stream.value)
        offset = self.offsets.setdefault((key, stream), 0)
        if path is None:
            return 0, True
        # Read the state first: when it says ended, the file is whole before we read it.
        state = JobDir(path.parent).read_state()
        ended = state is not None and state.finished
        sent = 0
        try:
            with open(path, "rb") as f:
                for _ in range(MAX_CHUNKS_PER_ROUND):
                    f.seek(offset)
                    data = f.read(self.chunk_bytes)
                    last = ended and len(data) < self.chunk_bytes and not f.read(1)
                    if not data and not last:
                        return sent, True
                    ack = self.sink.ship_logs(
                        LogChunkRequest(
                            assignment_id=key,
                            stream=stream,
                            offset=offset,
                            data=base64.b64encode(data).decode("ascii"),
                            final=last,
                        )
                    )
                    if not ack.kept:
                        self._refused.add(key)
                        return sent, True
                    sent += len(data)
                    offset = self.offsets[(key, stream)] = ack.next_offset
                    if last:
                        self._finished.add((key, stream))
                        return sent, True
        except OSError as exc:
            log.debug("cannot read %s: %s", path, exc)
            return sent, True
        return sent, False

    def _forget(self, key: str) -> None:
        self._draining.discard(key)
        for stream in LogStream:
            self.offsets.pop((key, stream), None)
            self._finished.discard((key, stream))
