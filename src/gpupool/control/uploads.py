"""Working-directory uploads: a client sends a folder as a gzip'd tar, a job refers to it.

Words:

- **upload**: one archive a user sent with ``POST /v1/uploads``; its **upload id** is what a
  submit names in ``workdir_upload``. It belongs to the uploader's tenant: anyone else (other
  tenants) is answered 404, the same as for an id that does not exist.
- **limit**: ``settings.upload_max_bytes`` (default 100 MiB), the most bytes one archive may
  have; a larger one is refused with 413 before it is stored.

Files: ``<home>/uploads/<id>.tar.gz`` (the bytes, as sent) and ``<id>.json`` (tenant, user,
size, sha256, time). The server does not unpack archives; the node agent does, safely (see
:mod:`gpupool.agent.unpack`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.control import audit
from gpupool.control.auth import Actor, Principal, require, tenant_visible
from gpupool.control.bootstrap import DEFAULT_TENANT
from gpupool.control.context import ControlPlane
from gpupool.control.errors import NotFound, ServiceError
from gpupool.domain.users import Permission

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


class UploadService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.root = cp.settings.home / "uploads"
        self.limit = cp.settings.upload_max_bytes

    def _paths(self, upload_id: str) -> tuple[Path, Path]:
        return self.root / f"{upload_id}.tar.gz", self.root / f"{upload_id}.json"

    def create(self, actor: Actor, chunks: Iterable[bytes]) -> Upload:
        """Store an archive sent in ``chunks``; refuses (413) past the limit, keeping nothing."""
        principal = actor.principal
        require(principal, Permission.JOB_SUBMIT)
        self.root.mkdir(parents=True, exist_ok=True)
        upload_id = secrets.token_hex(16)
        data_path, meta_path = self._paths(upload_id)
        tmp = data_path.with_suffix(".part")
        digest = hashlib.sha256()
        size = 0
        try:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    size += len(chunk)
                    if size > self.limit:
                        raise TooLarge(too_large_message(self.limit))
                    digest.update(chunk)
                    f.write(chunk)
            os.replace(tmp, data_path)
        finally:
            tmp.unlink(missing_ok=True)
        now = self.cp.now()
        up = Upload(
            upload_id,
            principal.tenant or DEFAULT_TENANT,
            principal.user,
            size,
            digest.hexdigest(),
            now,
        )
        meta_path.write_text(json.dumps(up.__dict__), encoding="utf-8")
        with self.cp.tx() as s:
            audit.record(s, actor, "upload.create", now, target=upload_id)
        return up

    def _meta(self, upload_id: str) -> Upload | None:
        if not _ID.match(upload_id):
            return None
        data_path, meta_path = self._paths(upload_id)
        try:
            data: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not data_path.is_file():
            return None
        return Upload(**data)

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

    def file_for_agent(self, principal: Principal, upload_id: str) -> Path:
        """The archive's path, for node agents only."""
        require(principal, Permission.AGENT)
        if self._meta(upload_id) is None:
            raise _not_found(upload_id)
        return self._paths(upload_id)[0]
