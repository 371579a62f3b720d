"""Users and their API tokens.

Who may manage whom: ``admin`` manages every user; ``tenant-admin`` manages the users of its own
tenant, and only with roles up to its own (tenant-admin, member, viewer). Tokens of a user are
managed by whoever may manage the user, and by the user (its own tokens).
A token's secret is returned once, by :meth:`UserService.create_token`, and never again.

**Minted tokens**: a token made through the API remembers the token of the caller who made it
(its *parent*). Revoking a token revokes its descendants (the tokens it minted, theirs, and so
on), and deleting a user revokes the descendants of all its tokens: a stolen token cannot leave
behind a copy of itself that outlives its revocation. A minted token never outlives its parent's
expiry (:func:`_within_parent`), and an agent token mints no tokens at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Conflict, Forbidden, Invalid, NotFound, Unauthorized
from gpupool.control.services import audit
from gpupool.control.services.auth import Actor, Principal, new_secret, require
from gpupool.domain.bounds import ANY_DURATION_S
from gpupool.domain.errors import InvalidValue
from gpupool.domain.users import Permission, Role, User
from gpupool.store.mapping import user_from_row
from gpupool.store.models import TenantModel, TokenModel, UserModel

TENANT_ROLES = (Role.TENANT_ADMIN, Role.MEMBER, Role.VIEWER)


@dataclass(frozen=True)
class IssuedToken:
    """A new token. ``secret`` is shown to the caller once and never stored."""

    id: str
    user: str
    name: str
    secret: str
    expires_at: float | None


@dataclass(frozen=True)
class TokenInfo:
    id: str
    user: str
    name: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None


def _may_manage(principal: Principal, role: Role, tenant: str | None) -> bool:
    if principal.can(Permission.USER_MANAGE_ANY):
        return True
    return (
        principal.can(Permission.USER_MANAGE_TENANT)
        and tenant is not None
        and tenant == principal.tenant
        and role in TENANT_ROLES
    )


def _load_user(session: Session, principal: Principal, name: str) -> UserModel:
    row = session.get(UserModel, name)
    visible = row is not None and (
        principal.can(Permission.USER_MANAGE_ANY)
        or principal.user == name
        or (principal.can(Permission.USER_MANAGE_TENANT) and row.tenant == principal.tenant)
    )
    if row is None or not visible:
        raise NotFound(f"user {name!r} not found: list users with `gpupool users`")
    return row


def insert_token(
    session: Session,
    user: str,
    name: str,
    now: float,
    ttl_s: float | None,
    *,
    parent_id: str | None = None,
) -> IssuedToken:
    """Add a token; ``parent_id``: the token of the caller who minted it (``None`` for one the
    server or an operator at the store makes)."""
    token_id, secret, digest = new_secret()
    expires = now + ttl_s if ttl_s is not None else None
    session.add(
        TokenModel(
            id=token_id,
            user=user,
            name=name,
            secret_sha256=digest,
            created_at=now,
            expires_at=expires,
            parent_id=parent_id,
        )
    )
    return IssuedToken(token_id, user, name, secret, expires)


def _within_parent(
    session: Session, principal: Principal, now: float, ttl_s: float | None
) -> float | None:
    """The lifetime of a token ``principal`` mints: never past the expiry of the caller's own
    token (the parent). No lifetime asked: the parent's remaining one; a longer one asked:
    :class:`Invalid` saying how long is allowed."""
    parent = session.get(TokenModel, principal.token_id)
    if parent is not None and parent.revoked_at is not None:  # revoked while this call ran
        raise Unauthorized("the API token was revoked: ask an admin for a new one")
    expires = parent.expires_at if parent is not None else None
    if expires is None:
        return ttl_s
    left = max(0.0, expires - now)
    if ttl_s is None:
        return left
    if ttl_s > left:
        raise Invalid(
            f"the token making this call expires in {left:.0f} s, and a token it creates may "
            f"not outlive it: ask for a lifetime of at most {left:.0f} s, or create the token "
            "with a token that does not expire (an admin's)"
        )
    return ttl_s


def revoke_with_descendants(session: Session, roots: list[TokenModel], now: float) -> list[str]:
    """Revoke ``roots`` and every token minted by them, by those, and so on (a token minted by a
    revoked token must not outlive it); returns the ids newly revoked, roots first."""
    revoked: list[str] = []
    seen: set[str] = set()
    layer = list(roots)
    while layer:
        ids = []
        for token in layer:
            if token.id in seen:
                continue
            seen.add(token.id)
            ids.append(token.id)
            if token.revoked_at is None:
                token.revoked_at = now
                revoked.append(token.id)
        layer = (
            list(session.scalars(select(TokenModel).where(TokenModel.parent_id.in_(ids))))
            if ids
            else []
        )
    return revoked


class UserService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def create(self, actor: Actor, name: str, role: Role, tenant: str | None) -> User:
        principal = actor.principal
        require(principal, Permission.USER_MANAGE_ANY, Permission.USER_MANAGE_TENANT)
        if role in TENANT_ROLES and tenant is None and principal.tenant is not None:
            tenant = principal.tenant
        try:
            user = User(name=name, role=role, tenant=tenant)
        except (InvalidValue, ValueError) as exc:
            raise Invalid(str(exc)) from None
        if not _may_manage(principal, role, tenant):
            raise Forbidden(
                f"role {principal.role.value} may not create a {role.value} user in "
                f"{tenant or 'no tenant'}: tenant admins create tenant-admin, member and "
                "viewer users of their own tenant"
            )
        now = self.cp.now()
        with self.cp.tx() as s:
            if tenant is not None and s.get(TenantModel, tenant) is None:
                raise Invalid(f"tenant {tenant!r} does not exist: create it first")
            if s.get(UserModel, name) is not None:
                raise Conflict(f"user {name!r} already exists: pick another name")
            s.add(UserModel(name=name, role=role.value, tenant=tenant, created_at=now))
            audit.record(s, actor, "user.create", now, target=name)
        return user

    def list_users(self, principal: Principal) -> list[User]:
        require(principal, Permission.USER_MANAGE_ANY, Permission.USER_MANAGE_TENANT)
        with self.cp.tx() as s:
            query = select(UserModel).order_by(UserModel.name)
            if not principal.can(Permission.USER_MANAGE_ANY):
                query = query.where(UserModel.tenant == principal.tenant)
            return [user_from_row(r) for r in s.scalars(query)]

    def delete(self, actor: Actor, name: str) -> None:
        principal = actor.principal
        require(principal, Permission.USER_MANAGE_ANY, Permission.USER_MANAGE_TENANT)
        now = self.cp.now()
        with self.cp.tx() as s:
            row = _load_user(s, principal, name)
            if not _may_manage(principal, Role(row.role), row.tenant):
                raise Forbidden(f"role {principal.role.value} may not delete user {name}")
            if name == principal.user:
                raise Conflict("you cannot delete yourself: ask another admin")
            row.disabled = True
            owned = list(s.scalars(select(TokenModel).where(TokenModel.user == name)))
            revoke_with_descendants(s, owned, now)
            audit.record(s, actor, "user.delete", now, target=name)
        self.cp.principals.clear()  # its tokens stop working in this process now

    def create_token(
        self, actor: Actor, user: str | None, name: str, ttl_s: float | None
    ) -> IssuedToken:
        principal = actor.principal
        target = user or principal.user
        if principal.role is Role.AGENT:
            # An agent needs no token but its own, and one it minted would be a second key to
            # every tenant's uploads that an operator did not hand out: refused outright.
            raise Forbidden(
                "an agent token may not create tokens: an admin creates each agent's token "
                "(`gpupool tokens create --user AGENT_USER`)"
            )
        if ttl_s is not None and ttl_s <= 0:
            raise Invalid("a token's lifetime must be positive: use e.g. 30d, or none")
        if ttl_s is not None:
            try:
                ANY_DURATION_S.check(ttl_s, field="the token's lifetime")
            except InvalidValue as exc:
                raise Invalid(str(exc)) from None
        now = self.cp.now()
        with self.cp.tx() as s:
            row = _load_user(s, principal, target)
            if target != principal.user and not _may_manage(principal, Role(row.role), row.tenant):
                raise Forbidden(f"role {principal.role.value} may not create tokens for {target}")
            if row.disabled:
                raise Conflict(f"user {target} is disabled: enable or recreate the user")
            ttl_s = _within_parent(s, principal, now, ttl_s)
            issued = insert_token(s, target, name, now, ttl_s, parent_id=principal.token_id)
            audit.record(s, actor, "token.create", now, target=f"{target}/{issued.id}")
        return issued

    def list_tokens(self, principal: Principal, user: str | None) -> list[TokenInfo]:
        target = user or principal.user
        with self.cp.tx() as s:
            row = _load_user(s, principal, target)
            if target != principal.user and not _may_manage(principal, Role(row.role), row.tenant):
                raise NotFound(f"user {target!r} not found")
            rows = s.scalars(
                select(TokenModel).where(TokenModel.user == target).order_by(TokenModel.created_at)
            )
            return [
                TokenInfo(t.id, t.user, t.name, t.created_at, t.expires_at, t.revoked_at)
                for t in rows
            ]

    def revoke_token(self, actor: Actor, token_id: str) -> None:
        principal = actor.principal
        now = self.cp.now()
        with self.cp.tx() as s:
            token = s.get(TokenModel, token_id)
            owner = s.get(UserModel, token.user) if token is not None else None
            allowed = (
                token is not None
                and owner is not None
                and (
                    token.user == principal.user
                    or _may_manage(principal, Role(owner.role), owner.tenant)
                )
            )
            if token is None or not allowed:
                raise NotFound(f"token {token_id!r} not found: list tokens with `gpupool tokens`")
            revoked = revoke_with_descendants(s, [token], now)
            audit.record(s, actor, "token.revoke", now, target=token_id)
            for child in revoked:
                if child != token_id:
                    audit.record(s, actor, "token.revoke", now, target=f"{child} (via {token_id})")
        self.cp.principals.clear()  # the token stops working in this process now
