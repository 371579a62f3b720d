"""First start: default pool, tenant and priority classes, and the admin token.

The admin token is written to ``$GPUPOOL_HOME/admin-token`` with mode 0600 (created that way,
never chmod-ed afterwards, so it is never readable by others even for a moment). It is written
only when the store has no admin user yet; later starts leave it alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import select

from gpupool.control.context import ControlPlane
from gpupool.control.services import audit
from gpupool.control.services.users import insert_token
from gpupool.domain.pools import DEFAULT_POOL
from gpupool.domain.tenants import DEFAULT_PRIORITY_CLASSES
from gpupool.domain.users import Role
from gpupool.store.models import (
    LeaderModel,
    PoolModel,
    PriorityClassModel,
    TenantModel,
    UserModel,
)

ADMIN_USER = "admin"
DEFAULT_TENANT = "default"


def write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` to ``path`` readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    if tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(secret + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def bootstrap(cp: ControlPlane) -> Path | None:
    """Create the defaults on an empty store; returns the admin token path when it wrote one."""
    now = cp.now()
    with cp.tx() as s:
        if s.get(LeaderModel, 1) is None:
            s.add(LeaderModel(id=1, epoch=0, holder="", since=now))
        if s.get(PoolModel, DEFAULT_POOL) is None:
            s.add(PoolModel(name=DEFAULT_POOL, prices={}, created_at=now))
        if s.get(TenantModel, DEFAULT_TENANT) is None:
            s.add(TenantModel(name=DEFAULT_TENANT, created_at=now))
        for pc in DEFAULT_PRIORITY_CLASSES:
            if s.get(PriorityClassModel, pc.name) is None:
                s.add(PriorityClassModel(name=pc.name, value=pc.value))
        has_admin = s.scalar(select(UserModel.name).where(UserModel.role == Role.ADMIN.value))
        if has_admin is not None:
            return None
        s.add(UserModel(name=ADMIN_USER, role=Role.ADMIN.value, tenant=None, created_at=now))
        s.flush()
        issued = insert_token(s, ADMIN_USER, "first-start admin token", now, None)
        audit.record(s, None, "bootstrap", now, target=ADMIN_USER, user="server", role="system")
        # Write the file before the commit: if writing fails, the admin does not exist either
        # and the next start tries again.
        write_secret(cp.settings.admin_token_path, issued.secret)
    return cp.settings.admin_token_path
