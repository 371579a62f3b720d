"""Who is calling, and may they do this.

Words:

- **token**: a bearer secret ``gp_<id>_<random>``; the server stores only its SHA-256 (the
  secret is 256 random bits, so a slow hash buys nothing) and shows the secret once.
- **principal**: the user behind a valid token, with role and tenant.
- **actor**: a principal plus where the call came from (method, path, remote address), which is
  what the audit log records.

Permissions per role are :data:`gpupool.domain.users.PERMISSIONS`; :func:`require` checks them.
Tenant scoping (another tenant's job is a 404, not a 403) is done by the services.

**Principal cache**: every request authenticates, so a token's principal is kept in memory
(:class:`PrincipalCache`, keyed by the token's hash) for a few seconds. A token's expiry is
still checked on every request. Revoking a token, deleting or changing a user clears the
cache of the server process that did it at once; other processes of the same store (other
workers, other servers) see the change within the cache's lifetime
(``ServerSettings.auth_cache_s``, 5 s by default).

**Renewal in batches** (:func:`revalidate`): a token in use is checked against the store again
before its entry runs out, for all such tokens in one query (``Liveness.flush``, once a
second), and its entry renewed for another lifetime. Without it a fleet whose nodes each have
their own token (docs/deploy.md allows both) heartbeating every 5 s found its entry gone at
each heartbeat (the lifetime is 5 s too), so every quiet heartbeat took the route's way, a
worker thread and a query of its own, instead of the short way. The bound on what another
process sees stays the same: a renewal reads the store, so a revoked token is dropped at the
next renewal, within the entry's lifetime of the revocation. A token is renewed once after it
was last used (or put again just after its entry ran out), not for ever: an unused token's
entry still runs out, and a token used less often than its lifetime costs no renewals.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.errors import Forbidden, Unauthorized
from gpupool.domain.users import Permission, Role, allows
from gpupool.store.models import TokenModel, UserModel

TOKEN_PREFIX = "gp_"


@dataclass(frozen=True)
class Principal:
    user: str
    role: Role
    tenant: str | None
    token_id: str

    def can(self, permission: Permission) -> bool:
        return allows(self.role, permission)

    @property
    def cluster_wide(self) -> bool:
        """True for roles that see every tenant (admin, operator)."""
        return self.can(Permission.JOB_READ_ANY)


@dataclass(frozen=True)
class Actor:
    principal: Principal
    method: str = ""
    path: str = ""
    remote: str | None = None


def new_secret() -> tuple[str, str, str]:
    """A fresh token: ``(token_id, secret, sha256_hex)``."""
    token_id = secrets.token_hex(6)
    secret = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    return token_id, secret, hash_secret(secret)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


NO_TOKEN = (
    "no API token: send 'Authorization: Bearer <token>' (the admin token is in "
    "$GPUPOOL_HOME/admin-token; create others with `gpupool tokens create`)"
)


class PrincipalCache:
    """Valid tokens' principals by token hash, each kept ``ttl_s`` seconds (monotonic time).

    Only successful authentications are kept; a token's own expiry (``expires_at``, store
    time) is checked on every hit. :meth:`clear` drops everything and makes lookups that
    were already under way when it ran not store their (possibly stale) result."""

    MAX_ENTRIES = 10_000

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        # digest -> (principal, token expires_at or None, monotonic deadline of the entry)
        self._entries: dict[str, tuple[Principal, float | None, float]] = {}
        self._fresh: set[str] = set()  # digests in use since their last renewal (see put)
        self._lock = threading.Lock()
        self.generation = 0

    def get(self, secret: str, now: float) -> Principal | None:
        digest = hash_secret(secret)
        entry = self._entries.get(digest)
        if entry is None:
            return None
        principal, expires_at, deadline = entry
        if time.monotonic() >= deadline or (expires_at is not None and expires_at <= now):
            return None
        self._fresh.add(digest)
        return principal

    def due(self, limit: int = 10_000) -> list[str]:
        """The digests to check again now (at most ``limit``): used since their last renewal
        (or put again just after they ran out), with less than half their lifetime left; they
        are no longer counted as used."""
        soon = time.monotonic() + self.ttl_s / 2
        with self._lock:
            due = [d for d in self._fresh if d in self._entries and self._entries[d][2] < soon]
            due = due[:limit]
            self._fresh.difference_update(due)
            self._fresh.intersection_update(self._entries)
        return due

    def has_due(self) -> bool:
        """Whether :meth:`due` would give anything (no lock)."""
        wait = self.due_in()
        return wait is not None and wait <= 0.0

    def due_in(self) -> float | None:
        """Seconds until :meth:`has_due` is first true if no token is used meanwhile (0 when
        it is); ``None`` while no token in use waits for a renewal. For a caller that sleeps
        in between instead of asking once a second (``api/shedding.py``: ``watch``)."""
        entries = self._entries
        found = [entries.get(d) for d in list(self._fresh)]  # one may be dropped meanwhile
        deadlines = [entry[2] for entry in found if entry is not None]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - self.ttl_s / 2 - time.monotonic())

    def renew(
        self, digest: str, principal: Principal, expires_at: float | None, generation: int
    ) -> None:
        """Keep ``digest``'s principal, as checked in the store just now, for another lifetime."""
        with self._lock:
            if generation == self.generation and digest in self._entries:
                deadline = time.monotonic() + self.ttl_s
                self._entries[digest] = (principal, expires_at, deadline)

    def drop(self, digests: list[str]) -> None:
        with self._lock:
            for digest in digests:
                self._entries.pop(digest, None)

    def put(
        self, secret: str, principal: Principal, expires_at: float | None, generation: int
    ) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            if generation != self.generation:
                return  # cleared while this lookup ran: its answer may be stale
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            now_mono = time.monotonic()
            digest = hash_secret(secret)
            before = self._entries.get(digest)
            self._entries[digest] = (principal, expires_at, now_mono + self.ttl_s)
            if before is not None and now_mono - before[2] < self.ttl_s / 2:
                # Used again just after its entry ran out (a node heartbeating about as
                # often as the lifetime): keep it renewed from now on. A token used less
                # often is not renewed for nothing (an idle pool's one agent).
                self._fresh.add(digest)

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._entries.clear()
            self._fresh.clear()


def revalidate(session: Session, cache: PrincipalCache, now: float) -> tuple[int, int]:
    """Check the cache's due tokens (:meth:`PrincipalCache.due`) against the store in one
    query and renew those still valid, as :func:`authenticate` would find them; drop the
    others. Returns ``(renewed, dropped)``."""
    generation = cache.generation
    due = cache.due()
    if not due:
        return 0, 0
    valid = _valid(session, due, now)
    for digest, (principal, expires_at) in valid.items():
        cache.renew(digest, principal, expires_at, generation)
    gone = [d for d in due if d not in valid]
    cache.drop(gone)
    return len(valid), len(gone)


def agent_tokens(session: Session, digests: list[str], now: float) -> set[str]:
    """Which of the token hashes ``digests`` are valid now for a principal that may act as
    an agent (one query per thousand)."""
    valid = _valid(session, digests, now)
    return {d for d, (principal, _) in valid.items() if principal.can(Permission.AGENT)}


def _valid(
    session: Session, digests: list[str], now: float
) -> dict[str, tuple[Principal, float | None]]:
    """The token hashes among ``digests`` that may be used now, as :func:`authenticate`
    finds them: hash -> (principal, the token's expiry). One query per thousand hashes."""
    valid: dict[str, tuple[Principal, float | None]] = {}
    for start in range(0, len(digests), 1000):
        rows = session.execute(
            _TOKEN_AND_USER.where(TokenModel.secret_sha256.in_(digests[start : start + 1000]))
        ).all()
        for row in rows:
            if _refusal(row, now) is None:
                valid[row.secret_sha256] = (_principal(row), row.expires_at)
    return valid


_TOKEN_AND_USER = select(
    TokenModel.id,
    TokenModel.secret_sha256,
    TokenModel.revoked_at,
    TokenModel.expires_at,
    UserModel.name,
    UserModel.role,
    UserModel.tenant,
    UserModel.disabled,
).join(UserModel, UserModel.name == TokenModel.user)


def _refusal(row: Any, now: float) -> str | None:
    """Why the token of ``row`` (``_TOKEN_AND_USER``) may not be used now, or ``None``."""
    if row.revoked_at is not None:
        return "the API token was revoked: ask an admin for a new one"
    if row.expires_at is not None and row.expires_at <= now:
        return "the API token has expired: create a new one"
    if row.disabled:
        return f"user {row.name} is disabled: ask an admin"
    return None


def _principal(row: Any) -> Principal:
    return Principal(user=row.name, role=Role(row.role), tenant=row.tenant, token_id=row.id)


def authenticate(
    session: Session, secret: str | None, now: float, cache: PrincipalCache | None = None
) -> Principal:
    """The principal for ``secret``, or :class:`Unauthorized` saying why not.

    With ``cache``, a principal found there is returned without a query, and one found in
    the store is added to it."""
    if not secret:
        raise Unauthorized(NO_TOKEN)
    if cache is not None:
        hit = cache.get(secret, now)
        if hit is not None:
            return hit
    generation = cache.generation if cache is not None else 0
    digest = hash_secret(secret)
    row = session.execute(_TOKEN_AND_USER.where(TokenModel.secret_sha256 == digest)).first()
    if row is None or not hmac.compare_digest(row.secret_sha256, digest):
        raise Unauthorized("the API token is not valid: check it, or ask an admin for a new one")
    refusal = _refusal(row, now)
    if refusal is not None:
        raise Unauthorized(refusal)
    principal = _principal(row)
    if cache is not None:
        cache.put(secret, principal, row.expires_at, generation)
    return principal


def require(principal: Principal, *permissions: Permission) -> None:
    """Raise :class:`Forbidden` unless the principal holds at least one of ``permissions``."""
    if any(principal.can(p) for p in permissions):
        return
    wanted = " or ".join(p.value for p in permissions)
    raise Forbidden(
        f"role {principal.role.value} may not do this (needs {wanted}): ask an admin for a "
        "role that allows it"
    )


def tenant_visible(principal: Principal, tenant: str) -> bool:
    """Whether the principal may see objects of ``tenant`` at all."""
    return principal.cluster_wide or principal.tenant == tenant
