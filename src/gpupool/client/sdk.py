"""``gpupool.Client``: the typed HTTP SDK over the ``/v1`` API.

One :class:`Client` holds one ``httpx.Client`` (connection reuse) with the bearer token. Every
method returns the API's pydantic wire models from :mod:`gpupool.schemas` (never dicts) and
raises :class:`~gpupool.client.errors.ApiError` with the server's problem+json ``detail``, or
:class:`~gpupool.client.errors.ServerUnreachable`, never an httpx exception.

Submitting takes a job in job-file form (the mapping a YAML job file parses to) and/or keyword
options (``gpus=0.5, gpu_memory="10GiB"``; see :data:`OPTION_PATHS`); both are validated here
with :func:`gpupool.domain.jobspec.build_spec`, the very rules the server applies, so a bad size
fails before any network call.

Example::

    from gpupool import Client
    with Client() as gp:                      # server and token found as in gpupool.client.config
        job = gp.submit(name="train", command=["python", "train.py"], gpus=0.5, gpu_memory="10GiB")
        done = gp.wait(job.id)
        print(done.state, "".join(gp.logs(job.id)))
"""

from __future__ import annotations

import builtins
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from gpupool import __version__
from gpupool.client.config import Resolved, gpupool_home, resolve
from gpupool.client.errors import (
    ApiError,
    ConfigError,
    ServerUnreachable,
    WaitTimeout,
)
from gpupool.client.logs import LOG_SETTLE_S, LineSplitter, LogPage, LogPiece
from gpupool.client.merge import merge_spec
from gpupool.client.pack import DEFAULT_LIMIT_BYTES, pack_folder
from gpupool.client.results import unpack_results
from gpupool.client.telemetry import ClusterTelemetry, parse_metrics
from gpupool.domain.clock import Clock, SystemClock
from gpupool.domain.jobspec import build_spec, nest_options
from gpupool.domain.states import JobState
from gpupool.schemas.admin import (
    AuditView,
    IssuedTokenView,
    PoolView,
    PriorityClassView,
    QuotaView,
    TenantView,
    TokenView,
    UserView,
    WhoAmI,
)
from gpupool.schemas.base import read_answer, read_answers
from gpupool.schemas.jobs import (
    BulkJobsResponse,
    JobEventView,
    JobList,
    JobView,
    SubmitJobResponse,
    UploadView,
)
from gpupool.schemas.nodes import ClusterEventView, DeviceView, NodeView, UsageReport
from gpupool.schemas.priority import PriorityList

M = TypeVar("M", bound=BaseModel)

#: Keyword options of :meth:`Client.submit` and the job-file key each one sets.
OPTION_PATHS: dict[str, str] = {
    "name": "name",
    "command": "command",
    "script": "script",
    "env": "env",
    "workdir": "workdir",
    "tenant": "tenant",
    "pool": "pool",
    "priority": "priority",
    "gpus": "resources.gpus",
    "gpu_memory": "resources.gpu_memory",
    "gpu_types": "resources.gpu_types",
    "cpus": "resources.cpus",
    "memory": "resources.memory",
    "replicas": "replicas",
    "preemptible": "preemptible",
    "requeue": "requeue",
    "max_restarts": "max_restarts",
    "time_limit": "time_limit",
    "expected_duration": "expected_duration",
    "checkpoint_signal": "checkpoint.signal",
    "grace": "checkpoint.grace",
    "isolation": "isolation",
    # sbatch --dependency: "afterok:ID[:ID]", "singleton", ... (gpupool.domain.dependency)
    "dependency": "dependency",
    # sbatch --nodelist / --exclude: node names, a list or "n1,n2"
    "nodelist": "nodelist",
    "exclude": "exclude",
    "image": "container.image",  # run in an image: Client.submit(image=..., container_mounts=[...])
    "container_mounts": "container.mounts",
    "container_workdir": "container.workdir",
    "container_env": "container.env",
    "container_engine": "container.engine",
}


def options_to_spec(options: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword options (``gpus=0.5``) to a nested job-file mapping; ``None`` values dropped."""
    unknown = sorted(set(options) - set(OPTION_PATHS))
    if unknown:
        raise ConfigError(
            f"unknown submit option(s) {', '.join(unknown)}: use {', '.join(OPTION_PATHS)}"
        )
    return nest_options({OPTION_PATHS[k]: v for k, v in options.items()})


def _problem(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    detail = body.get("detail") or response.text.strip()[:300] or response.reason_phrase
    return ApiError(response.status_code, str(body.get("title") or "error"), str(detail))


#: The most jobs the server answers in one page of ``GET /v1/jobs``.
PAGE_SIZE = 1000


class Client:
    """A connection to one gpupool server (see the module docstring).

    ``server`` / ``token`` default to the discovery chain of :mod:`gpupool.client.config`.
    ``home`` is where a local pool keeps its files (``$GPUPOOL_HOME``), used to read logs of jobs
    run by this machine's agent. ``transport`` is for tests (``httpx.MockTransport``).
    """

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 15.0,
        clock: Clock | None = None,
        home: Path | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.resolved: Resolved = resolve(server, token)
        self.server = self.resolved.server
        self.clock: Clock = clock or SystemClock()
        self.home = home or gpupool_home()
        headers = {"User-Agent": f"gpupool-client/{__version__}"}
        if self.resolved.token:
            headers["Authorization"] = f"Bearer {self.resolved.token}"
        # A plain-HTTP server needs no TLS: not building the certificate store saves every
        # command about 50 ms of CPU (redirects are not followed, so no request leaves the
        # base URL); an https:// server is verified as always.
        tls = not self.server.startswith("http://")
        self._http = httpx.Client(
            base_url=self.server,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            verify=tls,
        )

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        """Send one request; raise :class:`ApiError` for an error answer."""
        if not self.resolved.token and path.startswith("/v1/") and path != "/v1/version":
            raise ConfigError(
                f"no API token for {self.server}: pass --token, set GPUPOOL_TOKEN, or run "
                "gpupool login"
            )
        try:
            query: list[tuple[str, Any]] | None = None
            if params is not None:
                query = list(params.items()) if isinstance(params, Mapping) else list(params)
            response = self._http.request(
                method, path, json=json, params=query, headers=headers, content=content
            )
        except httpx.TimeoutException:
            raise ServerUnreachable(
                f"{self.server} did not answer in time: check the server is up, or retry"
            ) from None
        except httpx.TransportError as exc:
            raise ServerUnreachable(
                f"cannot reach {self.server} ({type(exc).__name__}): start it with gpupool up, "
                "or pass --server / set GPUPOOL_SERVER"
            ) from None
        if response.status_code >= 400:
            raise _problem(response)
        return response

    def _get(self, model: type[M], path: str, **params: Any) -> M:
        clean = {k: v for k, v in params.items() if v is not None}
        return read_answer(model, self.request("GET", path, params=clean).json())

    def _get_list(self, model: type[M], path: str, **params: Any) -> builtins.list[M]:
        clean = {k: v for k, v in params.items() if v is not None}
        data = self.request("GET", path, params=clean).json()
        return read_answers(model, data)

    # ------------------------------------------------------------------ identity

    def whoami(self) -> WhoAmI:
        return self._get(WhoAmI, "/v1/whoami")

    def version(self) -> str:
        return str(self.request("GET", "/v1/version").json().get("version", "?"))

    # ------------------------------------------------------------------ jobs

    def submit(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        retries: int = 2,
        workdir_upload: str | None = None,
        hold: bool = False,
        queue_anyway: bool = False,
        begin: float | None = None,
        **options: Any,
    ) -> JobView:
        """Submit a job (job-file mapping and/or keyword options); returns the new job.

        Raises :class:`~gpupool.domain.errors.SpecError` listing every problem before sending.
        Every submit carries an **idempotency key** (a random one unless given), so when the
        server cannot be reached or does not answer in time it is retried ``retries`` times
        with the same key: the server then returns the job the first attempt may have made,
        never a second one. ``workdir_upload`` is an id from :meth:`upload_workdir`: the job
        runs in that folder, unpacked on its node. ``hold=True`` submits it held (like
        ``sbatch --hold``): it waits until :meth:`release`. A job no node of its pool could
        ever hold (more GPU memory than any card, more GPUs or CPUs than any node, a GPU type
        no node has) is refused with the limit that fails; ``queue_anyway=True`` stores it
        anyway, to wait for nodes yet to join. ``begin`` (epoch seconds, like ``sbatch
        --begin``): it is not eligible to start before then. ``dependency="afterok:ID"`` (an
        option, like ``sbatch --dependency``): it waits for other jobs.
        """
        payload = self._submit_payload(spec, idempotency_key, workdir_upload, hold, options)
        if queue_anyway:
            payload["queue_anyway"] = True
        if begin is not None:
            payload["begin"] = begin
        return self._post_submit(payload, retries).job

    def submit_array(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        array: str,
        idempotency_key: str | None = None,
        retries: int = 2,
        workdir_upload: str | None = None,
        hold: bool = False,
        queue_anyway: bool = False,
        begin: float | None = None,
        **options: Any,
    ) -> builtins.list[JobView]:
        """Submit a job array (like ``sbatch --array``): one job per index of ``array``
        (``"0-9"``, ``"0-20:5"``, ``"1,3,8-10"``), named ``NAME[INDEX]``, each with
        ``GPUPOOL_ARRAY_TASK_ID``; returns the tasks in index order. Retried as :meth:`submit`
        (one key for the whole array)."""
        payload = self._submit_payload(spec, idempotency_key, workdir_upload, hold, options)
        payload["array"] = array
        if queue_anyway:
            payload["queue_anyway"] = True
        if begin is not None:
            payload["begin"] = begin
        return self._post_submit(payload, retries).array

    def _submit_payload(
        self,
        spec: Mapping[str, Any] | None,
        idempotency_key: str | None,
        workdir_upload: str | None,
        hold: bool,
        options: Mapping[str, Any],
    ) -> dict[str, Any]:
        body = merge_spec(spec or {}, options_to_spec(dict(options)))
        build_spec(body)
        key = idempotency_key or f"sdk-{secrets.token_hex(12)}"
        payload: dict[str, Any] = {"spec": body, "idempotency_key": key}
        if workdir_upload is not None:
            payload["workdir_upload"] = workdir_upload
        if hold:
            payload["hold"] = True
        return payload

    def _post_submit(self, payload: dict[str, Any], retries: int) -> SubmitJobResponse:
        for attempt in range(retries + 1):
            try:
                response = self.request("POST", "/v1/jobs", json=payload)
            except ServerUnreachable:
                if attempt == retries:
                    raise
                self.clock.sleep(0.5 * 2**attempt)
                continue
            return read_answer(SubmitJobResponse, response.json())
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def upload_workdir(self, path: str | Path, limit: int = DEFAULT_LIMIT_BYTES) -> str:
        """Pack folder ``path`` (without ``.git``, ``__pycache__``, ``.venv``) and upload it;
        returns the upload id to pass to :meth:`submit` as ``workdir_upload``.

        Raises :class:`~gpupool.client.errors.ConfigError` when it packs to more than
        ``limit`` bytes (nothing is sent), :class:`ApiError` (413) past the server's limit."""
        data = pack_folder(Path(path), limit)
        response = self.request(
            "POST", "/v1/uploads", content=data, headers={"Content-Type": "application/gzip"}
        )
        return read_answer(UploadView, response.json()).upload_id

    def get(self, job_id: str) -> JobView:
        """One job with its pending reason, estimated start and priority factors."""
        return self._get(JobView, f"/v1/jobs/{job_id}")

    def list(
        self,
        *,
        state: Sequence[str] | None = None,
        tenant: str | None = None,
        user: str | None = None,
        pool: str | None = None,
        name: str | None = None,
        array: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[JobView]:
        """Jobs newest first (``array``: the tasks of that job array), following the server's
        pages of at most ``PAGE_SIZE`` to the last one, or until ``limit`` jobs when given.

        Every caller that acts on what it lists (``cancel --array``) must see all of it: a
        default that stopped at one page cancelled 1,000 tasks of 10,000 and said nothing."""
        out: builtins.list[JobView] = []
        cursor: str | None = None
        while limit is None or len(out) < limit:
            size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(out))
            params: builtins.list[tuple[str, Any]] = [("limit", size)]
            params += [("state", s) for s in state or ()]
            filters = (("tenant", tenant), ("user", user), ("pool", pool), ("name", name))
            for key, value in (*filters, ("array", array)):
                if value is not None:
                    params.append((key, value))
            if cursor is not None:
                params.append(("cursor", cursor))
            page = read_answer(JobList, self.request("GET", "/v1/jobs", params=params).json())
            out.extend(page.jobs)
            cursor = page.next_cursor
            if cursor is None:
                break
        return out

    def cancel(self, job_id: str, reason: str | None = None) -> JobView:
        response = self.request("POST", f"/v1/jobs/{job_id}/cancel", json={"reason": reason})
        return read_answer(JobView, response.json())

    def bulk(
        self,
        action: str,
        *,
        ids: Sequence[str] = (),
        user: str | None = None,
        name: str | None = None,
        states: Sequence[str] = (),
        array: str | None = None,
        tenant: str | None = None,
        pool: str | None = None,
        reason: str | None = None,
    ) -> BulkJobsResponse:
        """``cancel``, ``hold`` or ``release`` every job a selection names, in one request and
        one transaction (``POST /v1/jobs/bulk``; like ``scancel -u alice -t PD``). ``ids`` are
        job or array ids; every filter given narrows the selection."""
        body = {
            "action": action,
            "ids": list(ids),
            "user": user,
            "name": name,
            "states": list(states),
            "array": array,
            "tenant": tenant,
            "pool": pool,
            "reason": reason,
        }
        response = self.request("POST", "/v1/jobs/bulk", json=body)
        return read_answer(BulkJobsResponse, response.json())

    def resize(
        self, job_id: str, *, gpus: str | None = None, gpu_memory: str | None = None
    ) -> JobView:
        """Resize a running shim job's slice in place (``POST /v1/jobs/{id}/resize``)."""
        body = {"gpus": gpus, "gpu_memory": gpu_memory}
        response = self.request("POST", f"/v1/jobs/{job_id}/resize", json=body)
        return read_answer(JobView, response.json())

    def hold(self, job_id: str) -> JobView:
        return read_answer(JobView, self.request("POST", f"/v1/jobs/{job_id}/hold").json())

    def release(self, job_id: str) -> JobView:
        return read_answer(JobView, self.request("POST", f"/v1/jobs/{job_id}/release").json())

    def update(self, job_id: str, **changes: Any) -> JobView:
        """Change a pending job (like ``scontrol update``): ``name``, ``priority`` (class),
        ``time_limit``, ``expected_duration`` (durations as in a job file: ``"2h"``) or
        ``preemptible``. Raises :class:`~gpupool.client.errors.ApiError` (422 bad value, 409
        the job has started)."""
        body = {key: value for key, value in changes.items() if value is not None}
        return read_answer(JobView, self.request("PATCH", f"/v1/jobs/{job_id}", json=body).json())

    def requeue(self, job_id: str) -> JobView:
        """Put a job that ended without finishing (failed, preempted, node or boot failure)
        back in the queue; :class:`~gpupool.client.errors.ApiError` (409) for any other state."""
        return read_answer(JobView, self.request("POST", f"/v1/jobs/{job_id}/requeue").json())

    def priorities(
        self, *, tenant: str | None = None, user: str | None = None, pool: str | None = None
    ) -> PriorityList:
        """Every pending job's priority factors as the scheduler last ranked them, highest
        first (``GET /v1/priorities``; like Slurm's ``sprio``)."""
        return self._get(PriorityList, "/v1/priorities", tenant=tenant, user=user, pool=pool)

    def events(self, job_id: str) -> builtins.list[JobEventView]:
        return self._get_list(JobEventView, f"/v1/jobs/{job_id}/events")

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

    # ------------------------------------------------------------------ nodes and devices

    def nodes(self) -> builtins.list[NodeView]:
        return self._get_list(NodeView, "/v1/nodes")

    def node(self, name: str) -> NodeView:
        return self._get(NodeView, f"/v1/nodes/{name}")

    def delete_node(self, name: str) -> None:
        """Remove a node that is down and holds no assignment (operator or admin)."""
        self.request("DELETE", f"/v1/nodes/{name}")

    def devices(self) -> builtins.list[DeviceView]:
        return self._get_list(DeviceView, "/v1/devices")

    def set_node_state(self, name: str, state: str) -> NodeView:
        response = self.request("POST", f"/v1/nodes/{name}/state", json={"state": state})
        return read_answer(NodeView, response.json())

    def move_device(self, uuid: str, pool: str) -> None:
        self.request("POST", f"/v1/devices/{uuid}/pool", json={"pool": pool})

    def telemetry(self) -> ClusterTelemetry:
        """Latest device samples, allocations, queue and mem_share_ratio (from ``/metrics``)."""
        return parse_metrics(self.request("GET", "/metrics").text)

    def cluster_events(self, limit: int = 100) -> builtins.list[ClusterEventView]:
        return self._get_list(ClusterEventView, "/v1/events", limit=limit)

    # ------------------------------------------------------------------ reports

    def usage(
        self,
        *,
        start: float | None = None,
        end: float | None = None,
        group_by: Sequence[str] = ("tenant",),
        tenant: str | None = None,
    ) -> UsageReport:
        """Usage and cost lines grouped by ``tenant``, ``user``, ``pool`` and/or ``gpu_model``."""
        params: builtins.list[tuple[str, Any]] = [("group_by", g) for g in group_by]
        for key, value in (("start", start), ("end", end), ("tenant", tenant)):
            if value is not None:
                params.append((key, value))
        return read_answer(UsageReport, self.request("GET", "/v1/usage", params=params).json())

    def audit(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        user: str | None = None,
        action: str | None = None,
        target: str | None = None,
        limit: int = 100,
    ) -> builtins.list[AuditView]:
        """The audit log, newest first (admins and operators); ``action`` is a prefix."""
        return self._get_list(
            AuditView,
            "/v1/audit",
            limit=limit,
            since=since,
            until=until,
            user=user,
            action=action,
            target=target,
        )

    # ------------------------------------------------------------------ admin

    def pools(self) -> builtins.list[PoolView]:
        return self._get_list(PoolView, "/v1/pools")

    def put_pool(self, name: str, **fields: Any) -> PoolView:
        response = self.request("PUT", f"/v1/pools/{name}", json=fields)
        return read_answer(PoolView, response.json())

    def delete_pool(self, name: str) -> None:
        self.request("DELETE", f"/v1/pools/{name}")

    def tenants(self) -> builtins.list[TenantView]:
        return self._get_list(TenantView, "/v1/tenants")

    def tenant(self, name: str) -> TenantView:
        return self._get(TenantView, f"/v1/tenants/{name}")

    def put_tenant(self, name: str, **fields: Any) -> TenantView:
        response = self.request("PUT", f"/v1/tenants/{name}", json=fields)
        return read_answer(TenantView, response.json())

    def delete_tenant(self, name: str) -> None:
        self.request("DELETE", f"/v1/tenants/{name}")

    def set_quota(self, tenant: str, pool: str, **fields: Any) -> QuotaView:
        response = self.request("PUT", f"/v1/tenants/{tenant}/quotas/{pool}", json=fields)
        return read_answer(QuotaView, response.json())

    def delete_quota(self, tenant: str, pool: str) -> None:
        self.request("DELETE", f"/v1/tenants/{tenant}/quotas/{pool}")

    def priority_classes(self) -> builtins.list[PriorityClassView]:
        return self._get_list(PriorityClassView, "/v1/priority-classes")

    def put_priority_class(self, name: str, value: int) -> PriorityClassView:
        response = self.request("PUT", f"/v1/priority-classes/{name}", json={"value": value})
        return read_answer(PriorityClassView, response.json())

    def users(self) -> builtins.list[UserView]:
        return self._get_list(UserView, "/v1/users")

    def create_user(self, name: str, role: str, tenant: str | None = None) -> UserView:
        response = self.request(
            "POST", "/v1/users", json={"name": name, "role": role, "tenant": tenant}
        )
        return read_answer(UserView, response.json())

    def delete_user(self, name: str) -> None:
        self.request("DELETE", f"/v1/users/{name}")

    def tokens(self, user: str | None = None) -> builtins.list[TokenView]:
        return self._get_list(TokenView, "/v1/tokens", user=user)

    def create_token(
        self, user: str | None = None, name: str = "", ttl_s: float | None = None
    ) -> IssuedTokenView:
        """A new token; its ``secret`` is in this answer only."""
        response = self.request(
            "POST", "/v1/tokens", json={"user": user, "name": name, "ttl_s": ttl_s}
        )
        return read_answer(IssuedTokenView, response.json())

    def revoke_token(self, token_id: str) -> None:
        self.request("DELETE", f"/v1/tokens/{token_id}")


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
