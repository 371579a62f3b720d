"""Tokens and the audit log against a real ``gpupool server`` process (issue 24 items 5, 6).

Item 5: revoking a token with ``gpupool tokens revoke`` revokes the tokens it minted and theirs
(each one used afterwards gets 401), and an agent token cannot mint tokens (403), so none that
never expires. Item 6: ``X-Forwarded-For`` from a client that is no named proxy changes neither
the audit row's source address nor the refused-call limit; from a proxy named with
``--trusted-proxies`` it names the caller; and an anonymous POST is a 401 whatever its body.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpupool.control.services.audit import REFUSED_KEEP
from tests.api.server_proc import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(home=tmp_path_factory.mktemp("lineage") / "home") as proc:
        yield proc


def cli(server: ServerProcess, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPOOL_SERVER": server.url, "GPUPOOL_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def mint(server: ServerProcess, token: str, *args: str) -> str:
    done = cli(server, token, "tokens", "create", "-q", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def whoami(server: ServerProcess, token: str) -> int:
    r = httpx.get(f"{server.url}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    return r.status_code


def token_id(secret: str) -> str:
    return secret.split("_")[1]


def test_revoking_a_token_revokes_what_it_minted_and_theirs(server: ServerProcess) -> None:
    admin = server.admin_token()
    assert (
        cli(
            server, admin, "users", "create", "carol", "--role", "member", "--tenant", "default"
        ).returncode
        == 0
    )
    parent = mint(server, admin, "--user", "carol", "--name", "laptop")
    child = mint(server, parent, "--name", "ci")
    grandchild = mint(server, child, "--name", "script")
    bystander = mint(server, admin, "--user", "carol", "--name", "desk")
    assert [whoami(server, t) for t in (parent, child, grandchild)] == [200, 200, 200]
    done = cli(server, admin, "tokens", "revoke", token_id(parent))
    assert done.returncode == 0, done.stderr
    assert [whoami(server, t) for t in (parent, child, grandchild)] == [401, 401, 401]
    assert whoami(server, bystander) == 200  # a sibling the revoked token did not mint
    rows = httpx.get(
        f"{server.url}/v1/audit",
        params={"action": "token.revoke"},
        headers={"Authorization": f"Bearer {admin}"},
    ).json()
    targets = {row["target"] for row in rows}
    assert f"{token_id(child)} (via {token_id(parent)})" in targets
    assert f"{token_id(grandchild)} (via {token_id(parent)})" in targets


def test_an_agent_token_mints_no_token(server: ServerProcess) -> None:
    admin = server.admin_token()
    assert cli(server, admin, "users", "create", "node-7", "--role", "agent").returncode == 0
    agent = mint(server, admin, "--user", "node-7")
    done = cli(server, agent, "tokens", "create", "-q", "--name", "forever")
    assert done.returncode != 0
    assert "an agent token may not create tokens" in done.stderr
    r = httpx.post(
        f"{server.url}/v1/tokens",
        json={"name": "forever"},
        headers={"Authorization": f"Bearer {agent}"},
    )
    assert r.status_code == 403, r.text


def _refused_rows(server: ServerProcess, path: str) -> list[dict[str, object]]:
    admin = server.admin_token()
    rows = httpx.get(
        f"{server.url}/v1/audit",
        params={"limit": 1000},
        headers={"Authorization": f"Bearer {admin}"},
    ).json()
    return [r for r in rows if r["path"] == path]


def test_a_forwarded_address_from_an_unnamed_client_is_not_believed(
    server: ServerProcess,
) -> None:
    path = "/v1/pools/xff-probe"
    with httpx.Client(base_url=server.url) as client:
        for i in range(60):
            r = client.put(
                path,
                json={},
                headers={"Authorization": "Bearer gp_bad", "X-Forwarded-For": f"203.0.113.{i}"},
            )
            assert r.status_code == 401
    rows = _refused_rows(server, path)
    remotes = {row["remote"] for row in rows}
    assert remotes == {"127.0.0.1"}, remotes
    # one caller: REFUSED_KEEP rows, then one row counting the rest
    assert len([r for r in rows if r["action"] == "refused"]) == REFUSED_KEEP
    more = [r for r in rows if r["action"] == "refused.more"]
    assert len(more) == 1
    assert str(more[0]["target"]).startswith(f"{60 - REFUSED_KEEP} more refused calls")


def test_an_anonymous_post_is_401_whatever_its_body(server: ServerProcess) -> None:
    for body in (b"{}", b"not json", b'{"spec": {"name": 5}}'):
        for path in ("/v1/jobs", "/v1/tokens", "/v1/agent/heartbeat", "/v1/users"):
            r = httpx.post(
                f"{server.url}{path}", content=body, headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 401, (path, body, r.status_code, r.text)
            assert "Authorization: Bearer" in r.json()["detail"]


def test_a_named_proxy_names_the_caller(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with ServerProcess(home=home, extra_args=("--trusted-proxies", "127.0.0.1/32")) as proxied:
        path = "/v1/pools/via-proxy"
        r = httpx.put(
            f"{proxied.url}{path}",
            json={},
            headers={
                "Authorization": "Bearer gp_bad",
                "X-Forwarded-For": "198.51.100.9, 127.0.0.1",
            },
        )
        assert r.status_code == 401
        assert {row["remote"] for row in _refused_rows(proxied, path)} == {"198.51.100.9"}
