"""Job logs kept by the server: agents ship new bytes, clients read them back.

Words:

- **stream**: ``stdout`` or ``stderr`` of one replica (rank) of a job.
- **node offset**: a byte position in the replica's log file on its node (per assignment; a
  restarted job has a new assignment whose node offsets start at 0 again).
- **log offset**: a byte position in the server's log of one job replica and stream. It counts
  every byte ever kept, across restarts, so it only grows; bytes older than the newest
  ``settings.log_keep_bytes`` are dropped and a read from before them starts at the oldest kept
  (the reader sees ``start`` past the offset it asked for, and says what was dropped).
- **complete**: the job has ended and the node has shipped the end of this stream of its last
  attempt (the agent's chunk with ``final``), or its last attempt never ran (a boot failure, a
  job stopped before its program started or never delivered): nothing more will come.

Reads are bytes, exactly as the job wrote them (a page may end inside a UTF-8 character; the
client decodes across pages). Files: ``<home>/logs/<job id>/<rank>.<stream>.log`` (the bytes)
and ``....json`` (the log offset of its first byte; per assignment, the node offset received so
far, so a resent chunk is not stored twice, and whether its end arrived). An ``flock`` on the
JSON file orders writers (exclusive) and readers (shared), also across server worker processes
on one machine, so a read never sees the bytes of one trim with the offsets of another; servers
on several machines need a shared ``home``.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import select

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Invalid, NotFound
from gpupool.control.services.auth import Actor, Principal, require, tenant_visible
from gpupool.domain.assignments import StopReason
from gpupool.domain.states import JobState
from gpupool.domain.users import Permission
from gpupool.schemas.agent import LogAck, LogChunkRequest, LogStream
from gpupool.store.models import AssignmentModel, JobModel

#: The most bytes one read by offset returns (a follower asks again from ``next_offset``).
READ_MAX_BYTES = 4 * 1024 * 1024

#: How far back from the end a ``tail`` read looks for its lines, at most.
TAIL_MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class LogBytes:
    """A piece of one log. ``data`` starts at log offset ``start``; ``next_offset`` is the one
    to ask for next. ``first`` is the oldest log offset still kept (bytes before it were
    dropped), ``end`` the offset after the newest byte received, and ``complete`` is True when
    nothing will be added after ``end`` (see the module docstring)."""

    data: bytes
    start: int
    next_offset: int
    first: int
    end: int
    complete: bool

    @property
    def text(self) -> str:
        """``data`` decoded (a character cut at either end of the page becomes U+FFFD)."""
        return self.data.decode("utf-8", "replace")


class LogService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.root = cp.settings.home / "logs"
        self.keep = max(1024, cp.settings.log_keep_bytes)

    def _paths(self, job_id: str, rank: int, stream: LogStream) -> tuple[Path, Path]:
        folder = self.root / job_id
        return folder / f"{rank}.{stream.value}.log", folder / f"{rank}.{stream.value}.json"

    @contextmanager
    def _locked(self, meta: Path) -> Iterator[dict[str, Any]]:
        meta.parent.mkdir(parents=True, exist_ok=True)
        with open(meta, "a+", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            state = _parse_state(f.read())
            yield state
            f.seek(0)
            f.truncate()
            f.write(json.dumps(state))
            f.flush()

    # ------------------------------------------------------------------ agents write
    def append(self, actor: Actor, chunk: LogChunkRequest) -> LogAck:
        """Keep a chunk of new bytes; resent bytes (below what was received) are skipped.
        A ``final`` chunk also records that the stream of its assignment is whole."""
        require(actor.principal, Permission.AGENT)
        try:
            raw = base64.b64decode(chunk.data, validate=True)
        except (binascii.Error, ValueError):
            raise Invalid("log chunk 'data' is not valid base64") from None
        with self.cp.read() as s:
            a = s.get(AssignmentModel, chunk.assignment_id)
            where = (a.job_id, a.rank) if a is not None else None
        if where is None:
            return LogAck(next_offset=chunk.offset + len(raw), kept=False)
        log_path, meta = self._paths(where[0], where[1], chunk.stream)
        with self._locked(meta) as state:
            received = int(state["received"].get(chunk.assignment_id, 0))
            end = chunk.offset + len(raw)
            if chunk.final and end >= received:
                state["final"][chunk.assignment_id] = True
            if end <= received:
                return LogAck(next_offset=received)
            new = raw[max(0, received - chunk.offset) :]
            with open(log_path, "ab") as f:
                f.write(new)
                size = f.tell()
            state["received"][chunk.assignment_id] = end
            if size > self.keep + self.keep // 8:
                state["base"] = int(state["base"]) + self._trim(log_path, size)
        return LogAck(next_offset=end)

    def _trim(self, path: Path, size: int) -> int:
        """Keep the newest ``keep`` bytes of ``path``; returns how many were dropped."""
        drop = size - self.keep
        with open(path, "rb") as f:
            f.seek(drop)
            tail = f.read()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(tail)
        os.replace(tmp, path)
        return drop

    # ------------------------------------------------------------------ clients read
    def read(
        self,
        principal: Principal,
        job_id: str,
        stream: LogStream = LogStream.STDOUT,
        *,
        replica: int = 0,
        tail: int | None = None,
        offset: int | None = None,
    ) -> LogBytes:
        """The log of one replica: its last ``tail`` lines, or from log ``offset`` on, or
        from its oldest kept byte; at most ``READ_MAX_BYTES`` (ask again from
        ``next_offset``). Others' jobs are not found."""
        require(principal, Permission.JOB_READ, Permission.JOB_READ_ANY)
        with self.cp.read() as s:
            row = s.get(JobModel, job_id)
            if row is None or not tenant_visible(principal, row.tenant):
                raise NotFound(f"job {job_id!r} not found: list your jobs with `gpupool queue`")
            ended = JobState(row.state).is_terminal
            last = s.scalars(
                select(AssignmentModel)
                .where(AssignmentModel.job_id == job_id, AssignmentModel.rank == replica)
                .order_by(AssignmentModel.created_at.desc(), AssignmentModel.id.desc())
                .limit(1)
            ).first()
            # An attempt that ran ships its logs, to a final chunk; one that never ran (boot
            # failure, stopped before it started, never delivered) has none to wait for. A
            # quick job may end before it was ever seen running: its exit says it ran.
            ran = (
                last is not None
                and last.stop_reason != StopReason.BOOT.value
                and (
                    last.started_at is not None
                    or last.exit_code is not None
                    or last.signal is not None
                )
            )
            last_id = last.id if ran and last is not None else None
        log_path, meta = self._paths(job_id, replica, stream)
        if not meta.exists():
            return LogBytes(b"", 0, 0, 0, 0, ended and last_id is None)
        with open(meta, encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)  # no trim between the offsets and the bytes
            state = _parse_state(lock.read())
            base = int(state["base"])
            try:
                size = log_path.stat().st_size
                with open(log_path, "rb") as f:
                    start, data = _piece(f, base, size, tail=tail, offset=offset)
            except OSError:
                size, start, data = 0, base, b""
        end = base + size
        complete = ended and (last_id is None or bool(state["final"].get(last_id)))
        return LogBytes(data, start, start + len(data), base, end, complete)


def _parse_state(text: str) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(text or "{}")
    except ValueError:
        state = {}
    state.setdefault("base", 0)
    state.setdefault("received", {})
    state.setdefault("final", {})
    return state


def _piece(
    f: BinaryIO, base: int, size: int, *, tail: int | None, offset: int | None
) -> tuple[int, bytes]:
    """(log offset, bytes) of one read of a log file holding log offsets ``base`` on."""
    end = base + size
    if offset is None and tail is not None:
        if tail <= 0:
            return end, b""
        back = min(size, TAIL_MAX_BYTES)
        f.seek(size - back)
        window: bytes = f.read(back)
        lines = window.splitlines(keepends=True)
        if back < size and lines:
            lines = lines[1:]  # the first line of the window may be cut
        piece = b"".join(lines[-tail:])
        return end - len(piece), piece
    start = min(max(offset or 0, base), end)
    f.seek(start - base)
    return start, f.read(READ_MAX_BYTES)
