"""The SDK's calls on the cluster rather than on one job: nodes and devices, reports
(usage, audit), and administration (pools, tenants and their quotas, priority classes, users,
tokens).

:class:`ClusterCalls` is mixed into :class:`gpupool.client.sdk.Client`; each method is one
request of the ``/v1`` API (the server checks the caller's role), its answer read into the
wire models of :mod:`gpupool.schemas`.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from gpupool.client.session import Session
from gpupool.client.telemetry import ClusterTelemetry, parse_metrics
from gpupool.schemas.admin import (
    AuditView,
    IssuedTokenView,
    PoolView,
    PriorityClassView,
    QuotaView,
    TenantView,
    TokenView,
    UserView,
)
from gpupool.schemas.base import read_answer
from gpupool.schemas.nodes import ClusterEventView, DeviceView, NodeView, UsageReport


class ClusterCalls(Session):
    """See the module docstring."""

    # ------------------------------------------------------------------ nodes and devices

    def nodes(self) -> builtins.list[NodeView]:
        return self._get_list(NodeView, "/v1/nodes")

    def node(self, name: str) -> NodeView:
        return self._get(NodeView, f"/v1/nodes/{name}")

    def delete_node(self, name: str) -> None:
        """Remove a node that is down and holds no assignment (operator or admin)."""
        self.request("DELETE", f"/v1/nodes/{name}")

    def devices(self) -> builtins.list[DeviceView]:
        return self._get_list(DeviceView, "/v1/devices")

    def set_node_state(self, name: str, state: str) -> NodeView:
        response = self.request("POST", f"/v1/nodes/{name}/state", json={"state": state})
        return read_answer(NodeView, response.json())

    def move_device(self, uuid: str, pool: str) -> None:
        self.request("POST", f"/v1/devices/{uuid}/pool", json={"pool": pool})

    def telemetry(self) -> ClusterTelemetry:
        """Latest device samples, allocations, queue and mem_share_ratio (from ``/metrics``)."""
        return parse_metrics(self.request("GET", "/metrics").text)

    def cluster_events(self, limit: int = 100) -> builtins.list[ClusterEventView]:
        return self._get_list(ClusterEventView, "/v1/events", limit=limit)

    # ------------------------------------------------------------------ reports

    def usage(
        self,
        *,
        start: float | None = None,
        end: float | None = None,
        group_by: Sequence[str] = ("tenant",),
        tenant: str | None = None,
    ) -> UsageReport:
        """Usage and cost lines grouped by ``tenant``, ``user``, ``pool`` and/or ``gpu_model``."""
        params: builtins.list[tuple[str, Any]] = [("group_by", g) for g in group_by]
        for key, value in (("start", start), ("end", end), ("tenant", tenant)):
            if value is not None:
                params.append((key, value))
        return read_answer(UsageReport, self.request("GET", "/v1/usage", params=params).json())

    def audit(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        user: str | None = None,
        action: str | None = None,
        target: str | None = None,
        limit: int = 100,
    ) -> builtins.list[AuditView]:
        """The audit log, newest first (admins and operators); ``action`` is a prefix."""
        return self._get_list(
            AuditView,
            "/v1/audit",
            limit=limit,
            since=since,
            until=until,
            user=user,
            action=action,
            target=target,
        )

    # ------------------------------------------------------------------ admin

    def pools(self) -> builtins.list[PoolView]:
        return self._get_list(PoolView, "/v1/pools")

    def put_pool(self, name: str, **fields: Any) -> PoolView:
        response = self.request("PUT", f"/v1/pools/{name}", json=fields)
        return read_answer(PoolView, response.json())

    def delete_pool(self, name: str) -> None:
        self.request("DELETE", f"/v1/pools/{name}")

    def tenants(self) -> builtins.list[TenantView]:
        return self._get_list(TenantView, "/v1/tenants")

    def tenant(self, name: str) -> TenantView:
        return self._get(TenantView, f"/v1/tenants/{name}")

    def put_tenant(self, name: str, **fields: Any) -> TenantView:
        response = self.request("PUT", f"/v1/tenants/{name}", json=fields)
        return read_answer(TenantView, response.json())

    def delete_tenant(self, name: str) -> None:
        self.request("DELETE", f"/v1/tenants/{name}")

    def set_quota(self, tenant: str, pool: str, **fields: Any) -> QuotaView:
        response = self.request("PUT", f"/v1/tenants/{tenant}/quotas/{pool}", json=fields)
        return read_answer(QuotaView, response.json())

    def delete_quota(self, tenant: str, pool: str) -> None:
        self.request("DELETE", f"/v1/tenants/{tenant}/quotas/{pool}")

    def priority_classes(self) -> builtins.list[PriorityClassView]:
        return self._get_list(PriorityClassView, "/v1/priority-classes")

    def put_priority_class(self, name: str, value: int) -> PriorityClassView:
        response = self.request("PUT", f"/v1/priority-classes/{name}", json={"value": value})
        return read_answer(PriorityClassView, response.json())

    def users(self) -> builtins.list[UserView]:
        return self._get_list(UserView, "/v1/users")

    def create_user(self, name: str, role: str, tenant: str | None = None) -> UserView:
        response = self.request(
            "POST", "/v1/users", json={"name": name, "role": role, "tenant": tenant}
        )
        return read_answer(UserView, response.json())

    def delete_user(self, name: str) -> None:
        self.request("DELETE", f"/v1/users/{name}")

    def tokens(self, user: str | None = None) -> builtins.list[TokenView]:
        return self._get_list(TokenView, "/v1/tokens", user=user)

    def create_token(
        self, user: str | None = None, name: str = "", ttl_s: float | None = None
    ) -> IssuedTokenView:
        """A new token; its ``secret`` is in this answer only."""
        response = self.request(
            "POST", "/v1/tokens", json={"user": user, "name": name, "ttl_s": ttl_s}
        )
        return read_answer(IssuedTokenView, response.json())

    def revoke_token(self, token_id: str) -> None:
        self.request("DELETE", f"/v1/tokens/{token_id}")
