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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpupool.client.cluster import ClusterCalls
from gpupool.client.errors import ConfigError, ServerUnreachable
from gpupool.client.follow import MAY_REQUEUE, REQUEUE_SETTLE_POLLS, Following, job_has_ended
from gpupool.client.merge import merge_spec
from gpupool.client.pack import DEFAULT_LIMIT_BYTES, pack_folder
from gpupool.client.session import Session
from gpupool.domain.jobspec import build_spec, nest_options
from gpupool.schemas.admin import WhoAmI
from gpupool.schemas.base import read_answer
from gpupool.schemas.jobs import (
    BulkJobsResponse,
    JobEventView,
    JobList,
    JobView,
    SubmitJobResponse,
    UploadView,
)
from gpupool.schemas.priority import PriorityList

__all__ = [
    "MAY_REQUEUE",
    "OPTION_PATHS",
    "PAGE_SIZE",
    "REQUEUE_SETTLE_POLLS",
    "Client",
    "Session",
    "job_has_ended",
    "options_to_spec",
]

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


#: The most jobs the server answers in one page of ``GET /v1/jobs``.
PAGE_SIZE = 1000


class Client(Following, ClusterCalls):
    """A connection to one gpupool server (see the module docstring).

    ``server`` / ``token`` default to the discovery chain of :mod:`gpupool.client.config`.
    ``home`` is where a local pool keeps its files (``$GPUPOOL_HOME``), used to read logs of jobs
    run by this machine's agent. ``transport`` is for tests (``httpx.MockTransport``).

    Its calls: a job's submission and handling here; following it (:meth:`get`, :meth:`wait`,
    its output and results) in :mod:`gpupool.client.follow`; nodes, reports and administration
    in :mod:`gpupool.client.cluster`; the connection in :mod:`gpupool.client.session`.
    """

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
