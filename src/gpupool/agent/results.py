"""Sending a job's results back to the server (``POST /v1/agent/results/{assignment}``).

A replica that ran in a copy of an uploaded working directory (``gpupool submit --workdir``)
leaves its results in that copy, on its node. When the job has ended, its supervisor packs the
copy as it is (:func:`pack_step`, run by :mod:`gpupool.agent.jobsteps` as the job's account on a
wall-time budget: the uploader's packing rules, without ``.git``, ``__pycache__``, ``.venv``;
at most :data:`~gpupool.client.pack.DEFAULT_LIMIT_BYTES` packed, and at most
:data:`MAX_INPUT_BYTES` read, every file counted at its full apparent size, so a sparse
``truncate -s 100G`` file is refused at once instead of gzipped for minutes) into the job
folder (``results.tar.gz``), or writes why it could not (``results-problem.txt``). The agent's
**result shipper** sends that once; a **problem** is sent in the results' place, so ``gpupool
fetch`` says why. Nothing of the job's files is read on the agent's heartbeat path.
The shipper runs before the log shipper in the same round, and an unreachable server
stops the round, so by the time a log's end is sent (``final``), the results are on the server:
``gpupool run`` returning means ``gpupool fetch`` finds them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpupool.agent.jobfiles import RESULTS, RESULTS_PROBLEM
from gpupool.agent.transport import AgentRejected
from gpupool.client.errors import ConfigError
from gpupool.client.pack import DEFAULT_LIMIT_BYTES, SKIP, pack_folder
from gpupool.schemas.agent import AssignmentSpec

log = logging.getLogger("gpupool.agent.results")

#: The most bytes a job's folder may hold for its results to be packed (apparent sizes).
MAX_INPUT_BYTES = 1024 * 1024 * 1024


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
        self.pending: set[str] = set()
        self.sent: set[str] = set()

    def ship(self, ended: Iterable[tuple[str, AssignmentSpec]]) -> int:
        """Send the results of the ``ended`` replicas that ran in an uploaded folder and were
        not sent yet; returns how many were sent. An unreachable server propagates (the caller
        retries next round; what was not sent stays pending); a refusal is logged, not retried."""
        for key, assignment in ended:
            if assignment.workdir_upload is None or key in self.sent:
                continue
            self.pending.add(key)
        count = 0
        for key in sorted(self.pending):
            data, problem = self._packed(self.jobs_dir / key)
            try:
                self.sink.ship_results(key, data, problem, self.agent_id)
            except AgentRejected as exc:  # refused for good (unknown assignment, too large)
                log.warning("results of %s not kept by the server: %s", key, exc)
            self.pending.discard(key)
            self.sent.add(key)
            count += 1
        return count

    def _packed(self, folder: Path) -> tuple[bytes, str | None]:
        """What the supervisor packed into the job folder ``folder``, or the problem."""
        try:
            problem = (folder / RESULTS_PROBLEM).read_text(encoding="utf-8", errors="replace")
        except OSError:
            problem = None
        if problem is not None:
            return b"", _ascii(problem)
        try:
            return (folder / RESULTS).read_bytes(), None
        except OSError:
            return b"", "the node did not pack the job's results (its supervisor ended early)"


def _ascii(text: str) -> str:
    return text.strip().encode("ascii", "replace").decode("ascii")[:2000]


def input_bytes(folder: Path, budget: int) -> int:
    """The bytes :func:`~gpupool.client.pack.pack_folder` would read from ``folder``: every
    regular file at its apparent size (sparse ones in full), links not followed; stops
    counting once past ``budget``."""
    total = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in SKIP]
        for name in files:
            if name in SKIP:
                continue
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(root, name))
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
        if total > budget:
            break
    return total


def pack_step(args: dict[str, Any]) -> tuple[int, bytes]:
    """The ``pack`` step of :mod:`gpupool.agent.jobsteps`, run by the replica's supervisor as
    the job's account: ``args`` names the ``folder``, the packed ``limit`` and the
    ``max_input_bytes``. Returns ``(0, the archive)`` or ``(REFUSED, the reason)``."""
    from gpupool.agent.jobsteps import REFUSED

    folder, budget = Path(args["folder"]), int(args["max_input_bytes"])
    if not folder.is_dir():
        return REFUSED, b"the job's working folder is no longer on its node"
    try:
        size = input_bytes(folder, budget)
        if size > budget:
            return REFUSED, (
                f"the job's folder holds more than {budget} bytes (each file counted at its "
                f"full size, sparse files too), over the budget for results: leave large "
                "outputs in shared storage, not in the job's folder"
            ).encode()
        return 0, pack_folder(folder, int(args["limit"]))
    except ConfigError as exc:
        return REFUSED, str(exc).encode(errors="replace")
    except OSError as exc:
        return REFUSED, f"the node could not read the job's folder: {exc.strerror or exc}".encode()
