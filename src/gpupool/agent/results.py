"""Sending a job's results back to the server (``POST /v1/agent/results/{assignment}``).

A replica that ran in a copy of an uploaded working directory (``gpupool submit --workdir``)
leaves its results in that copy, on its node. When the replica has exited, the agent's **result
shipper** packs the copy as it is (the uploader's packing rules: without ``.git``,
``__pycache__``, ``.venv``; at most :data:`~gpupool.client.pack.DEFAULT_LIMIT_BYTES`) and sends
it once; a folder that cannot be packed is reported as a **problem** in its place, so ``gpupool
fetch`` says why. It runs before the log shipper in the same round, and an unreachable server
stops the round, so by the time a log's end is sent (``final``), the results are on the server:
``gpupool run`` returning means ``gpupool fetch`` finds them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from gpupool.agent.jobdir import JobDir, read_json
from gpupool.agent.transport import AgentRejected
from gpupool.client.errors import ConfigError
from gpupool.client.pack import DEFAULT_LIMIT_BYTES, pack_folder
from gpupool.schemas.agent import AssignmentSpec

log = logging.getLogger("gpupool.agent.results")


@runtime_checkable
class ResultSink(Protocol):
    """Where results go (the HTTP transport implements it)."""

    def ship_results(
        self, assignment_id: str, data: bytes, problem: str | None, agent_id: str | None = None
    ) -> None: ...


class ResultShipper:
    """See the module docstring. ``jobs_dir`` holds the replicas' job folders."""

    def __init__(
        self,
        sink: ResultSink,
        jobs_dir: Path,
        limit: int = DEFAULT_LIMIT_BYTES,
        *,
        agent_id: str | None = None,
    ) -> None:
        self.sink = sink
        self.agent_id = agent_id  # sent with each result: the server takes them from it only
        self.jobs_dir = jobs_dir
        self.limit = limit
        self.pending: dict[str, Path | None] = {}  # key -> the folder to pack (None: unknown)
        self.sent: set[str] = set()

    def ship(self, ended: Iterable[tuple[str, AssignmentSpec]]) -> int:
        """Send the results of the ``ended`` replicas that ran in an uploaded folder and were
        not sent yet; returns how many were sent. An unreachable server propagates (the caller
        retries next round; what was not sent stays pending); a refusal is logged, not retried."""
        for key, assignment in ended:
            if assignment.workdir_upload is None or key in self.sent or key in self.pending:
                continue
            launch = read_json(JobDir(self.jobs_dir / key).launch) or {}
            cwd = launch.get("cwd")
            self.pending[key] = Path(cwd) if isinstance(cwd, str) else None
        count = 0
        for key, folder in sorted(self.pending.items(), key=lambda kv: kv[0]):
            data, problem = self._pack(folder)
            try:
                self.sink.ship_results(key, data, problem, self.agent_id)
            except AgentRejected as exc:  # refused for good (unknown assignment, too large)
                log.warning("results of %s not kept by the server: %s", key, exc)
            del self.pending[key]
            self.sent.add(key)
            count += 1
        return count

    def _pack(self, folder: Path | None) -> tuple[bytes, str | None]:
        if folder is None or not folder.is_dir():
            return b"", "the job's working folder is no longer on its node"
        try:
            return pack_folder(folder, self.limit), None
        except ConfigError as exc:
            return b"", str(exc).encode("ascii", "replace").decode("ascii")
        except OSError as exc:
            log.warning("cannot pack %s: %s", folder, exc)
            return b"", f"the node could not read the job's folder: {exc.strerror or exc}"
