"""Job results: what a job left in its uploaded working directory, sent back by its node.

Words:

- **results**: a gzip'd tar of one replica's copy of the uploaded working directory (``gpupool
  submit --workdir DIR``) as the job left it, packed by the node's agent when the replica ended
  (without ``.git``, ``__pycache__``, ``.venv``; at most ``settings.upload_max_bytes``). Only a
  job with an upload has results: any other job ran in a folder the user can already see (the
  submit directory) or one they named.
- **problem**: why a node could not send a replica's results (too large, unreadable); kept in
  their place, so a fetch says it instead of "not found".
- **sender**: only the agent of the node the assignment ran on may send its results. An agent
  token alone does not say which node it speaks for (one token may serve many nodes, and any
  holder of an agent token could otherwise replace any tenant's results), so the agent names
  itself with its **agent id** (:data:`AGENT_HEADER`, the random id it registered the node
  with, kept private in its state folder); a request from another node, or naming no id, is
  refused with 403.

Files: ``<home>/results/<job id>/<rank>.tar.gz`` and ``<rank>.json`` (the assignment it came
from, its size, or the problem). The newest attempt's results replace an older attempt's. Like
logs, servers on several machines need a shared ``home``.
"""

from __future__ import annotations

import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Conflict, Forbidden, Invalid, NotFound
from gpupool.control.machinery.nodeorders import stored_job
from gpupool.control.services.auth import Actor, Principal, require, tenant_visible
from gpupool.domain.states import JobState
from gpupool.domain.users import Permission
from gpupool.store.models import AssignmentModel, JobModel, NodeModel

#: The header an agent names a problem in, instead of sending an archive.
PROBLEM_HEADER = "X-Results-Problem"
#: The header an agent names its agent id in (see **sender** above).
AGENT_HEADER = "X-Gpupool-Agent-Id"


@dataclass(frozen=True)
class Results:
    """One replica's results: the archive's ``path`` and ``size`` in bytes."""

    path: Path
    size: int


class ResultService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.root = cp.settings.home / "results"
        self.limit = cp.settings.upload_max_bytes

    def _paths(self, job_id: str, rank: int) -> tuple[Path, Path]:
        folder = self.root / job_id
        return folder / f"{rank}.tar.gz", folder / f"{rank}.json"

    # ------------------------------------------------------------------ agents write
    def store(
        self,
        actor: Actor,
        assignment_id: str,
        data: bytes,
        problem: str | None,
        agent_id: str | None = None,
    ) -> int:
        """Keep a replica's results (or the problem that kept them from coming); returns the
        bytes kept. An assignment the server does not know is refused (409); one that ran on
        a node whose agent is not ``agent_id`` is refused (403, see **sender**)."""
        require(actor.principal, Permission.AGENT)
        if problem is None and len(data) > self.limit:
            raise Invalid(f"results over the {self.limit}-byte limit (upload_max_bytes)")
        with self.cp.read() as s:
            a = s.get(AssignmentModel, assignment_id)
            where = (a.job_id, a.rank) if a is not None else None
            node = s.get(NodeModel, a.node) if a is not None else None
            node_name = a.node if a is not None else ""
            speaker = node.agent_id if node is not None else None
        if where is None:  # 409, as the log route's kept=False: the agent does not retry
            raise Conflict(f"assignment {assignment_id!r} is not known: its results are not kept")
        if speaker is None or not hmac.compare_digest(speaker, agent_id or ""):
            raise Forbidden(
                f"assignment {assignment_id} ran on node {node_name}: only that node's agent "
                f"may send its results (send them from it, with its id in {AGENT_HEADER}; "
                "agents older than this server must be upgraded)"
            )
        archive, meta = self._paths(*where)
        archive.parent.mkdir(parents=True, exist_ok=True)
        if problem is None:
            tmp = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, archive)
        else:
            archive.unlink(missing_ok=True)
        tmp = meta.with_name(f".{meta.name}.{os.getpid()}.tmp")
        record = {"assignment": assignment_id, "size": len(data), "problem": problem}
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, meta)
        return len(data) if problem is None else 0

    # ------------------------------------------------------------------ clients read
    def find(self, principal: Principal, job_id: str, replica: int = 0) -> Results:
        """The results of one replica of a job the caller may see; otherwise an error that
        says why there are none and what to do."""
        require(principal, Permission.JOB_READ, Permission.JOB_READ_ANY)
        with self.cp.read() as s:
            row = s.get(JobModel, job_id)
            if row is None or not tenant_visible(principal, row.tenant):
                raise NotFound(f"job {job_id!r} not found: list your jobs with `gpupool queue`")
            state = JobState(row.state)
            stored = stored_job(row)
            uploaded = stored.workdir_upload is not None
            replicas = stored.job.spec.replicas
        if replica >= replicas:
            raise NotFound(f"job {job_id} has replicas 0 to {replicas - 1}, not {replica}")
        archive, meta = self._paths(job_id, replica)
        try:
            record = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = None
        if record is not None and record.get("problem"):
            raise Conflict(
                f"the node could not send the results of job {job_id}: {record['problem']}"
            )
        if record is not None and archive.exists():
            return Results(archive, archive.stat().st_size)
        if not uploaded:
            raise Conflict(
                f"job {job_id} has no results to fetch: only a job submitted with --workdir DIR "
                "(an uploaded folder) has them; any other job ran in a folder you can read "
                "(its submit directory or its workdir)"
            )
        if not state.is_terminal:
            raise Conflict(
                f"job {job_id} is {state.value}: its node sends its results when it ends; wait "
                f"for it (gpupool show {job_id}) and fetch again"
            )
        raise NotFound(
            f"the results of job {job_id} have not come from its node (it may be down, or the "
            f"job never started): see gpupool show {job_id}"
        )
