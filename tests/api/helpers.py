"""An in-process API over a test control plane, with one token per role."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi.testclient import TestClient

from gpupool.api.app import create_app
from gpupool.control.context import ControlPlane
from gpupool.web.routes import router as dashboard

ROLES = ("admin", "operator", "tenant-admin", "member", "viewer", "agent")
TENANT_ROLES = ("tenant-admin", "member", "viewer")


@dataclass
class Api:
    client: TestClient
    admin_token: str
    tokens: dict[str, str] = field(default_factory=dict)  # role -> secret (tenant "red")
    blue_member: str = ""

    def call(self, token: str, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {token}"}
        if isinstance(body, bytes):  # a raw body: the uploads endpoint takes a gzip'd tar
            headers["Content-Type"] = "application/gzip"
            return self.client.request(method, path, content=body, headers=headers)
        return self.client.request(method, path, json=body, headers=headers)

    def as_admin(self, method: str, path: str, body: Any = None) -> Any:
        response = self.call(self.admin_token, method, path, body)
        assert response.status_code < 300, response.text
        return response.json() if response.content else None

    def submit(self, token: str, name: str = "j", **spec: Any) -> str:
        body = {"spec": {"name": name, "command": ["true"], "resources": {"gpus": "0.5"}, **spec}}
        response = self.call(token, "POST", "/v1/jobs", body)
        assert response.status_code == 201, response.text
        job_id: str = response.json()["job"]["id"]
        return job_id


def make_api(cp: ControlPlane) -> Api:
    app = create_app(control=cp, routers=(dashboard,))
    client = TestClient(app)
    admin = cp.settings.admin_token_path.read_text().strip()
    api = Api(client, admin)
    for tenant in ("red", "blue"):
        api.as_admin("PUT", f"/v1/tenants/{tenant}", {"fair_share": 1.0})
    for role in ROLES:
        tenant = "red" if role in TENANT_ROLES else None
        name = f"{role}-red" if tenant else f"{role}-user"
        api.as_admin("POST", "/v1/users", {"name": name, "role": role, "tenant": tenant})
        api.tokens[role] = api.as_admin("POST", "/v1/tokens", {"user": name})["secret"]
    api.tokens["admin"] = admin
    api.as_admin("POST", "/v1/users", {"name": "member-blue", "role": "member", "tenant": "blue"})
    api.blue_member = api.as_admin("POST", "/v1/tokens", {"user": "member-blue"})["secret"]
    return api
