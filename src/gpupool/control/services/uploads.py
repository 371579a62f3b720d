"""Working-directory uploads: a client sends a folder as a gzip'd tar, a job refers to it.

Words:

- **upload**: one archive a user sent with ``POST /v1/uploads``; its **upload id** is what a
  submit names in ``workdir_upload``. It belongs to the uploader's tenant: anyone else (other
  tenants) is answered 404, the same as for an id that does not exist.
- **limit**: ``settings.upload_max_bytes`` (default 100 MiB), the most bytes one archive may
  have; a larger one is refused with 413 before it is stored.

- **retention**: ``settings.upload_retention_s`` (default 7 days); older uploads that no
  unfinished job names are deleted by :meth:`UploadService.prune`.

The bytes are kept in the store (table ``uploads``, committed before the answer), so any server
replica can hand them to any node's agent and an acknowledged upload survives a crash. The server
does not unpack archives; the node agent does, safely (see :mod:`gpupool.agent.unpack`).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, select

from gpupool.control.bootstrap import DEFAULT_TENANT
from gpupool.control.context import ControlPlane
from gpupool.control.errors import NotFound, ServiceError
from gpupool.control.services import audit
from gpupool.control.services.auth import Actor, Principal, require, tenant_visible
from gpupool.domain.states import JobState
from gpupool.domain.users import Permission
from gpupool.store.models import JobModel, UploadModel

_ID = re.compile(r"^[0-9a-f]{16,64}$")


class TooLarge(ServiceError):
    status = 413
    title = "upload too large"


@dataclass(frozen=True)
class Upload:
    """A stored archive: ``size`` in bytes, ``sha256`` hex of its bytes."""

    id: str
    tenant: str
    user: str
    size: int
    sha256: str
    time: float


def too_large_message(limit: int) -> str:
    return (
        f"the working directory archive is larger than the server's limit of {limit} bytes "
        f"({limit / 2**20:.0f} MiB): shrink the folder (leave out data sets, checkpoints and "
        "build outputs; read big data from shared storage instead) or ask an admin to raise "
        "upload_max_bytes"
    )


def _not_found(upload_id: str) -> NotFound:
    return NotFound(
        f"upload {upload_id!r} not found: upload the folder again (gpupool submit --workdir DIR)"
    )


_UNFINISHED = tuple(state.value for state in JobState if not state.is_terminal)


def _view(row: UploadModel) -> Upload:
    return Upload(row.id, row.tenant, row.user, row.size, row.sha256, row.created_at)


class UploadService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.limit = cp.settings.upload_max_bytes
        self.retention_s = cp.settings.upload_retention_s

    def create(self, actor: Actor, chunks: Iterable[bytes]) -> Upload:
        """Store an archive sent in ``chunks``; refuses (413) past the limit, keeping nothing."""
        principal = actor.principal
        require(principal, Permission.JOB_SUBMIT)
        parts: list[bytes] = []
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if size > self.limit:
                raise TooLarge(too_large_message(self.limit))
            parts.append(chunk)
        data = b"".join(parts)  # the one copy of the archive kept in memory
        now = self.cp.now()
        up = Upload(
            secrets.token_hex(16),
            principal.tenant or DEFAULT_TENANT,
            principal.user,
            len(data),
            hashlib.sha256(data).hexdigest(),
            now,
        )
        with self.cp.tx() as s:
            s.add(
                UploadModel(
                    id=up.id,
                    tenant=up.tenant,
                    user=up.user,
                    size=up.size,
                    sha256=up.sha256,
                    created_at=now,
                    data=data,
                )
            )
            audit.record(s, actor, "upload.create", now, target=up.id)
        return up

    def _meta(self, upload_id: str) -> Upload | None:
        if not _ID.match(upload_id):
            return None
        with self.cp.read() as s:
            row = s.get(UploadModel, upload_id)  # ``data`` is deferred: not read here
            return _view(row) if row is not None else None

    def get(self, principal: Principal, upload_id: str) -> Upload:
        """The upload, if ``principal`` may see it (its tenant, or a cluster-wide role)."""
        up = self._meta(upload_id)
        if up is None or not tenant_visible(principal, up.tenant):
            raise _not_found(upload_id)
        return up

    def check_for_job(self, principal: Principal, upload_id: str, tenant: str) -> Upload:
        """The upload a job of ``tenant`` submitted by ``principal`` names: it must exist and
        belong to that tenant."""
        up = self.get(principal, upload_id)
        if up.tenant != tenant:
            raise _not_found(upload_id)
        return up

    def data_for_agent(self, principal: Principal, upload_id: str) -> bytes:
        """The archive's bytes, for node agents only."""
        require(principal, Permission.AGENT)
        if not _ID.match(upload_id):
            raise _not_found(upload_id)
        with self.cp.read() as s:
            data = s.scalar(select(UploadModel.data).where(UploadModel.id == upload_id))
        if data is None:
            raise _not_found(upload_id)
        return bytes(data)

    def prune(self) -> list[str]:
        """Delete uploads older than the retention that no unfinished job names; their ids."""
        cutoff = self.cp.now() - self.retention_s
        with self.cp.tx() as s:
            old = set(s.scalars(select(UploadModel.id).where(UploadModel.created_at < cutoff)))
            if not old:
                return []
            specs = s.scalars(select(JobModel.spec).where(JobModel.state.in_(_UNFINISHED)))
            named = {spec.get("workdir_upload") for spec in specs}
            gone = sorted(old - named)
            if gone:
                s.execute(delete(UploadModel).where(UploadModel.id.in_(gone)))
        return gone
