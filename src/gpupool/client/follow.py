"""Following a job through the SDK: its state until it ends, its output, its results.

:class:`Following` is mixed into :class:`gpupool.client.sdk.Client`. :meth:`~Following.get`
reads a job once, :meth:`~Following.wait` polls it until it ends (a requeued job has not:
:data:`MAY_REQUEUE`'s states are looked at :data:`REQUEUE_SETTLE_POLLS` more times before they
are trusted). A job's logs are read as the server keeps them: :meth:`~Following.log_text` one
page, :meth:`~Following.output` the exact bytes of several streams (with ``follow``, by offset
until each stream is *complete*: the job ended and its node sent the stream's end),
:meth:`~Following.logs` as text lines. :meth:`~Following.fetch_results` unpacks what the job
left in its uploaded working directory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpupool.client.errors import ConfigError, WaitTimeout
from gpupool.client.logs import LOG_SETTLE_S, LineSplitter, LogPage, LogPiece
from gpupool.client.results import unpack_results
from gpupool.client.session import Session
from gpupool.domain.states import JobState
from gpupool.schemas.jobs import JobView

#: Terminal states a requeue policy may still bring back to the queue.
MAY_REQUEUE = frozenset(
    {JobState.PREEMPTED, JobState.NODE_FAIL, JobState.BOOT_FAIL, JobState.FAILED}
)
REQUEUE_SETTLE_POLLS = 3


def job_has_ended(job: JobView) -> bool:
    """True when the job is in a terminal state.

    A job in one of :data:`MAY_REQUEUE` may still move on to REQUEUED (the server records that
    move shortly after); :meth:`Client.wait` polls a few more times before trusting those.
    """
    return JobState(job.state).is_terminal


class Following(Session):
    """See the module docstring."""

    def get(self, job_id: str) -> JobView:
        """One job with its pending reason, estimated start and priority factors."""
        return self._get(JobView, f"/v1/jobs/{job_id}")

    def wait(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
        until: frozenset[JobState] | None = None,
        on_poll: Callable[[JobView], None] | None = None,
    ) -> JobView:
        """Poll until the job reaches a state in ``until`` (default: it ended); return it.

        A requeued job has not ended: waiting goes on through PREEMPTED -> REQUEUED -> PENDING.
        ``on_poll`` sees the job at each poll (e.g. :class:`PendingNotice`, which says why it
        waits). Raises :class:`WaitTimeout` after ``timeout_s``.
        """
        deadline = None if timeout_s is None else self.clock.monotonic() + timeout_s
        settle = REQUEUE_SETTLE_POLLS
        while True:
            job = self.get(job_id)
            if on_poll is not None:
                on_poll(job)
            state = JobState(job.state)
            if until is not None and state in until:
                return job
            if until is None and job_has_ended(job):
                # PREEMPTED, NODE_FAIL, BOOT_FAIL and FAILED may still move on to REQUEUED:
                # look again a few times before calling the job ended.
                if state not in MAY_REQUEUE or settle <= 0:
                    return job
                settle -= 1
                self.clock.sleep(min(poll_s, 0.5))
                continue
            settle = REQUEUE_SETTLE_POLLS
            if deadline is not None and self.clock.monotonic() >= deadline:
                raise WaitTimeout(
                    f"job {job_id} is still {job.state} after {timeout_s:g}s: "
                    f"check gpupool show {job_id}"
                )
            self.clock.sleep(poll_s)

    def log_text(
        self,
        job_id: str,
        *,
        stream: str = "stdout",
        replica: int = 0,
        tail: int | None = None,
        offset: int | None = None,
    ) -> LogPage:
        """One read of ``GET /v1/jobs/{id}/logs``: the last ``tail`` lines, or the bytes from
        log ``offset`` on (a page; ask again from ``next_offset``), or the oldest kept on."""
        if stream not in ("stdout", "stderr"):
            raise ConfigError(f"stream {stream!r} is not valid: use stdout or stderr")
        params: dict[str, Any] = {"stream": stream, "replica": replica}
        if tail is not None:
            params["tail"] = tail
        if offset is not None:
            params["offset"] = offset
        r = self.request("GET", f"/v1/jobs/{job_id}/logs", params=params)
        start = int(r.headers.get("X-Log-Start", "0"))
        end, complete = r.headers.get("X-Log-End"), r.headers.get("X-Log-Complete")
        return LogPage(
            r.content,
            start,
            int(r.headers.get("X-Log-Next", start + len(r.content))),
            first=int(r.headers.get("X-Log-First", start)),
            end=int(end) if end is not None else None,
            complete=complete == "true" if complete is not None else None,
        )

    def output(
        self,
        job_id: str,
        *,
        streams: Sequence[str] = ("stdout",),
        follow: bool = False,
        poll_s: float = 0.5,
        settle_s: float = LOG_SETTLE_S,
        on_poll: Callable[[JobView], None] | None = None,
    ) -> Iterator[LogPiece]:
        """The job's ``streams`` as the server keeps them, byte for byte, as pieces in the
        order they are read (each replica and stream in order by itself).

        Without ``follow``, what is there now. With ``follow``, until the server says each
        stream is complete (the job ended and its node sent the end); ``on_poll`` sees the job
        at each poll meanwhile. A piece's ``dropped`` counts bytes the server no longer kept
        just before it (``log_keep_bytes``); if the end of a stream has not come ``settle_s``
        after the job ended (its node is down), a last piece says so (``unfinished``)."""
        for stream in streams:
            if stream not in ("stdout", "stderr"):
                raise ConfigError(f"stream {stream!r} is not valid: use stdout or stderr")
        job = self.get(job_id)  # also checks the caller may see the job
        if on_poll is not None:
            on_poll(job)
        return self._output(
            job, streams, follow=follow, poll_s=poll_s, settle_s=settle_s, on_poll=on_poll
        )

    def _output(
        self,
        job: JobView,
        streams: Sequence[str],
        *,
        follow: bool,
        poll_s: float,
        settle_s: float,
        on_poll: Callable[[JobView], None] | None,
    ) -> Iterator[LogPiece]:
        keys = [(rank, stream) for rank in range(job.replicas) for stream in streams]
        offsets = dict.fromkeys(keys, 0)
        complete: set[tuple[int, str]] = set()
        legacy = False  # an older server, which does not say when a log is complete
        final = not follow or job_has_ended(job)
        ended_at = self.clock.monotonic()
        settle = REQUEUE_SETTLE_POLLS
        while True:
            progressed = False
            waiting = follow and JobState(job.state) in (JobState.PENDING, JobState.REQUEUED)
            for key in keys:
                if key in complete or waiting:  # a job in the queue writes nothing: no reads
                    continue
                page = self.log_text(job.id, stream=key[1], replica=key[0], offset=offsets[key])
                dropped = max(0, page.start - offsets[key])
                if page.data or dropped:
                    yield LogPiece(key[1], key[0], page.data, dropped)
                progressed = progressed or page.next_offset > offsets[key]
                offsets[key] = page.next_offset
                legacy = legacy or page.complete is None
                if page.complete and page.end is not None and page.next_offset >= page.end:
                    complete.add(key)
            if len(complete) == len(keys):
                # PREEMPTED and the like may still be requeued: look again before trusting it
                if not follow or JobState(job.state) not in MAY_REQUEUE or settle <= 0:
                    return
                settle -= 1
                self.clock.sleep(min(poll_s, 0.5))
                job = self.get(job.id)
                if not job_has_ended(job):
                    complete.clear()
                    final, settle = False, REQUEUE_SETTLE_POLLS
                continue
            if progressed:
                if final:  # the end is still coming in: the settle time starts again
                    ended_at = self.clock.monotonic()
                continue
            if final and (legacy or not follow):
                return
            if final and self.clock.monotonic() - ended_at > settle_s:
                for rank, stream in keys:
                    if (rank, stream) not in complete:
                        yield LogPiece(stream, rank, b"", unfinished=True)
                return
            self.clock.sleep(poll_s)
            job = self.get(job.id)
            if on_poll is not None:
                on_poll(job)
            if not final and job_has_ended(job):
                final, ended_at = True, self.clock.monotonic()

    def logs(
        self, job_id: str, *, stream: str = "stdout", follow: bool = False, poll_s: float = 0.5
    ) -> Iterator[str]:
        """The job's output as text, line by line (with ``follow``, until the job ends and
        its node sent the end; see :meth:`output`, which gives the exact bytes). A gang's
        lines are prefixed with the rank; bytes the server no longer keeps, or an end that
        never came, are said in a line of their own starting ``[gpupool:``."""
        job = self.get(job_id)
        gang = job.replicas > 1
        lines = {rank: LineSplitter() for rank in range(job.replicas)}
        for piece in self._output(
            job, (stream,), follow=follow, poll_s=poll_s, settle_s=LOG_SETTLE_S, on_poll=None
        ):
            prefix = f"[{piece.replica}] " if gang else ""
            split = lines[piece.replica]
            notice = piece.notice()
            if notice is not None:  # what was before the gap ends its line there
                yield from (prefix + line for line in split.flush(end="\n"))
                yield prefix + notice + "\n"
            yield from (prefix + line for line in split.feed(piece.data))
        for rank, split in lines.items():
            yield from ((f"[{rank}] " if gang else "") + line for line in split.flush())

    def fetch_results(self, job_id: str, dest: str | Path, *, replica: int = 0) -> int:
        """Unpack what job ``job_id`` (replica ``replica``) left in its uploaded working
        directory (``submit(..., workdir_upload=...)``) into ``dest``, a new or empty folder;
        returns the number of files. Its node sends them when the job ends. Raises
        :class:`ApiError`: 404 for a job that is not yours, 409 for a job without an upload,
        while it runs, or when its node could not send them (the detail says why)."""
        response = self.request("GET", f"/v1/jobs/{job_id}/results", params={"replica": replica})
        return unpack_results(response.content, Path(dest))
