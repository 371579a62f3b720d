"""Job logs kept by the server: agents ship new bytes, clients read them back.

Words:

- **stream**: ``stdout`` or ``stderr`` of one replica (rank) of a job.
- **node offset**: a byte position in the replica's log file on its node (per assignment; a
  restarted job has a new assignment whose node offsets start at 0 again).
- **log offset**: a byte position in the server's log of one job replica and stream. It counts
  every byte ever kept, across restarts, so it only grows; bytes older than the newest
  ``settings.log_keep_bytes`` are dropped and a read from before them starts at the oldest kept.

Files: ``<home>/logs/<job id>/<rank>.<stream>.log`` (the bytes) and ``....json`` (the log
offset of its first byte and, per assignment, the node offset received so far, so a resent
chunk is not stored twice). An ``flock`` on the JSON file orders writers, also across server
worker processes on one machine; servers on several machines need a shared ``home``.
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
from typing import Any

from gpupool.control.auth import Actor, Principal, require, tenant_visible
from gpupool.control.context import ControlPlane
from gpupool.control.errors import Invalid, NotFound
from gpupool.domain.users import Permission
from gpupool.schemas.agent import LogAck, LogChunkRequest, LogStream
from gpupool.store.models import AssignmentModel, JobModel

#: The most bytes one read by offset returns (a follower asks again from ``next_offset``).
READ_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class LogText:
    """Bytes of a log as text: ``start`` is the log offset of ``text``'s first byte and
    ``next_offset`` the one to ask for next (the end of what was returned)."""

    text: str
    start: int
    next_offset: int


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
            try:
                state: dict[str, Any] = json.loads(f.read() or "{}")
            except ValueError:
                state = {}
            state.setdefault("base", 0)
            state.setdefault("received", {})
            yield state
            f.seek(0)
            f.truncate()
            f.write(json.dumps(state))
            f.flush()

    # ------------------------------------------------------------------ agents write
    def append(self, actor: Actor, chunk: LogChunkRequest) -> LogAck:
        """Keep a chunk of new bytes; resent bytes (below what was received) are skipped."""
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
    ) -> LogText:
        """The log of one replica: its last ``tail`` lines, or from log ``offset`` on (at
        most ``READ_MAX_BYTES``), or all that is kept. Others' jobs are not found."""
        require(principal, Permission.JOB_READ, Permission.JOB_READ_ANY)
        with self.cp.read() as s:
            row = s.get(JobModel, job_id)
            if row is None or not tenant_visible(principal, row.tenant):
                raise NotFound(f"job {job_id!r} not found: list your jobs with `gpupool queue`")
        log_path, meta = self._paths(job_id, replica, stream)
        try:
            state = json.loads(meta.read_text(encoding="utf-8") or "{}")
            data = log_path.read_bytes()
        except (OSError, ValueError):
            return LogText("", 0, 0)
        base = int(state.get("base", 0))
        end = base + len(data)
        if offset is not None:
            start = min(max(offset, base), end)
            piece = data[start - base : start - base + READ_MAX_BYTES]
            return LogText(piece.decode("utf-8", "replace"), start, start + len(piece))
        if tail is not None:
            lines = data.splitlines(keepends=True)
            piece = b"".join(lines[-tail:]) if tail > 0 else b""
            return LogText(piece.decode("utf-8", "replace"), end - len(piece), end)
        return LogText(data.decode("utf-8", "replace"), base, end)
