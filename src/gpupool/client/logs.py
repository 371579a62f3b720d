"""Reading job logs: the pieces :meth:`gpupool.Client.output` yields and what they mean.

Words (the server's side is in :mod:`gpupool.control.services.logs`):

- **page**: one read of ``GET /v1/jobs/{id}/logs`` (:class:`LogPage`), bytes from a log offset;
- **piece**: bytes of one stream of one replica as a follower hands them on (:class:`LogPiece`),
  with what is missing before them (``dropped``) or after them (``unfinished``);
- **pending notice**: while a job waits in the queue, why, each time the reason changes
  (:class:`PendingNotice`), so ``gpupool run`` or a notebook's ``allocate()`` is not silent.
"""

from __future__ import annotations

import builtins
import codecs
import sys
from collections.abc import Callable
from dataclasses import dataclass

from gpupool.domain.states import JobState
from gpupool.schemas.jobs import JobView

#: How long :meth:`gpupool.Client.output` waits, after the job ended, for its node to send the
#: end of a log before saying it is unfinished (a node that went down never sends it).
LOG_SETTLE_S = 60.0


@dataclass(frozen=True)
class LogPage:
    """One read of a log: ``data`` starts at log offset ``start``, and ``next_offset`` is
    where the next read continues. ``first`` is the oldest offset the server still keeps,
    ``end`` the offset after the newest byte it has, and ``complete`` whether nothing more
    will come (``None`` for both from a server that does not say)."""

    data: bytes
    start: int
    next_offset: int
    first: int = 0
    end: int | None = None
    complete: bool | None = None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class LogPiece:
    """Bytes of one ``stream`` of one ``replica`` (see :meth:`Client.output`). ``dropped``:
    bytes just before ``data`` that the server no longer keeps; ``unfinished``: the stream's
    end never came from its node (``data`` is empty)."""

    stream: str
    replica: int
    data: bytes
    dropped: int = 0
    unfinished: bool = False

    def notice(self) -> str | None:
        """What a reader should be told about this piece, or ``None``."""
        if self.dropped:
            return (
                f"[gpupool: {self.dropped} bytes of {self.stream} are missing here: the server "
                "keeps only the newest log_keep_bytes of each log]"
            )
        if self.unfinished:
            return (
                f"[gpupool: the end of {self.stream} never came from the job's node (it may be "
                "down): the output may be incomplete]"
            )
        return None


class LineSplitter:
    """Bytes in, whole text lines out: UTF-8 decoded across pieces (a character split between
    two reads stays whole), the last partial line kept until more comes or :meth:`flush`."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.partial = ""

    def feed(self, data: bytes) -> builtins.list[str]:
        text = self.partial + self.decoder.decode(data)
        cut = text.rfind("\n") + 1
        self.partial = text[cut:]
        return text[:cut].splitlines(keepends=True)

    def flush(self, end: str = "") -> builtins.list[str]:
        rest = self.partial + self.decoder.decode(b"", final=True)
        self.decoder.reset()
        self.partial = ""
        return [rest + end] if rest else []


class PendingNotice:
    """An ``on_poll`` for :meth:`Client.wait` and :meth:`Client.output`: tells ``write`` (by
    default stderr) why the job waits, each time the reason changes, so a CI step waiting on
    ``gpupool run`` is not silent."""

    def __init__(self, write: Callable[[str], None] | None = None) -> None:
        self.write = write or _to_stderr
        self.last: str | None = None

    def __call__(self, job: JobView) -> None:
        if JobState(job.state) not in (JobState.PENDING, JobState.REQUEUED):
            self.last = None
            return
        if job.held:
            reason = f"held (JobHeld): it starts once released with gpupool release {job.id}"
        else:
            reason = job.pending_reason or job.reason or "waiting for the scheduler"
        if reason != self.last:
            self.last = reason
            self.write(f"gpupool: job {job.id} is pending: {reason}")


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
