"""``/v1/users``, ``/v1/tokens``, ``/v1/whoami`` and ``/v1/audit``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpupool.api.deps import Act, EpochQuery, Svc, Who
from gpupool.api.views import issued_view, token_view, user_view
from gpupool.control.errors import Invalid
from gpupool.control.services import audit
from gpupool.control.services.auth import require
from gpupool.domain.users import PERMISSIONS, Permission, Role
from gpupool.schemas.admin import (
    AuditView,
    CreateTokenRequest,
    CreateUserRequest,
    IssuedTokenView,
    TokenView,
    UserView,
    WhoAmI,
)

router = APIRouter(tags=["users"])


@router.get("/v1/whoami", response_model=WhoAmI)
def whoami(who: Who) -> WhoAmI:
    return WhoAmI(
        user=who.user,
        role=who.role.value,
        tenant=who.tenant,
        permissions=sorted(p.value for p in PERMISSIONS[who.role]),
    )


@router.get("/v1/users", response_model=list[UserView])
def list_users(svc: Svc, who: Who) -> list[UserView]:
    return [user_view(u) for u in svc.users.list_users(who)]


@router.post("/v1/users", status_code=201, response_model=UserView)
def create_user(body: CreateUserRequest, svc: Svc, act: Act) -> UserView:
    try:
        role = Role(body.role)
    except ValueError:
        names = ", ".join(r.value for r in Role)
        raise Invalid(f"role {body.role!r} is not valid: use one of {names}") from None
    return user_view(svc.users.create(act, body.name, role, body.tenant))


@router.delete("/v1/users/{name}", status_code=204)
def delete_user(name: str, svc: Svc, act: Act) -> None:
    svc.users.delete(act, name)


@router.get("/v1/tokens", response_model=list[TokenView])
def list_tokens(svc: Svc, who: Who, user: str | None = None) -> list[TokenView]:
    return [token_view(t) for t in svc.users.list_tokens(who, user)]


@router.post("/v1/tokens", status_code=201, response_model=IssuedTokenView)
def create_token(body: CreateTokenRequest, svc: Svc, act: Act) -> IssuedTokenView:
    """Create a token. Its ``secret`` is in this answer only: store it now."""
    return issued_view(svc.users.create_token(act, body.user, body.name, body.ttl_s))


@router.delete("/v1/tokens/{token_id}", status_code=204)
def revoke_token(token_id: str, svc: Svc, act: Act) -> None:
    svc.users.revoke_token(act, token_id)


@router.get("/v1/audit", response_model=list[AuditView])
def audit_log(  # noqa: PLR0917 - one query parameter per argument
    svc: Svc,
    who: Who,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    since: EpochQuery = None,
    until: EpochQuery = None,
    user: Annotated[str | None, Query(max_length=64)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    target: Annotated[str | None, Query(max_length=200)] = None,
) -> list[AuditView]:
    """Mutating calls, newest first: who (``user``), what (``action``, a prefix such as
    ``job`` or ``token.create``), on what (``target``), in ``[since, until)`` (epoch seconds)."""
    require(who, Permission.AUDIT_READ)
    with svc.cp.read() as s:
        rows = audit.recent(s, limit, since, until=until, actor=user, action=action, target=target)
        return [
            AuditView(
                time=r.time,
                actor=r.actor,
                role=r.role,
                action=r.action,
                method=r.method,
                path=r.path,
                status=r.status,
                remote=r.remote,
                target=r.target,
            )
            for r in rows
        ]
