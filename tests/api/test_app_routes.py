"""The pool's app: the API and the dashboard mounted side by side, each route once.

``gpupool server`` builds the app in the composition root (:func:`gpupool.cli.server.pool_app`):
the API does not import the dashboard (the import-linter contract keeps the edges independent),
so these tests check that the server a user starts still serves both, with one and with two
worker processes (``--workers 2`` builds its app through uvicorn's factory), and that no route
is registered twice.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from gpupool.api.app import create_app
from gpupool.api.routers import jobs
from gpupool.cli.server import pool_app
from gpupool.control.settings import ServerSettings
from gpupool.web.routes import router as dashboard
from tests.api.server_proc import ServerProcess


def _included(monkeypatch: pytest.MonkeyPatch, settings: ServerSettings) -> Counter[int]:
    """How many times each router object was included while the pool's app was built."""
    seen: Counter[int] = Counter()
    include = FastAPI.include_router

    def counting(self: FastAPI, router: APIRouter, *args: Any, **kwargs: Any) -> None:
        seen[id(router)] += 1
        include(self, router, *args, **kwargs)

    monkeypatch.setattr(FastAPI, "include_router", counting)
    pool_app(settings)
    return seen


def test_every_router_of_the_pool_app_is_included_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ServerSettings.build(home=tmp_path / "home", schedule=False)
    seen = _included(monkeypatch, settings)
    assert seen[id(dashboard)] == 1
    assert seen[id(jobs.router)] == 1
    assert max(seen.values()) == 1, seen


def test_the_api_alone_serves_no_dashboard(tmp_path: Path) -> None:
    app = create_app(ServerSettings.build(home=tmp_path / "home", schedule=False))
    with TestClient(app) as client:
        assert client.get("/v1/version").status_code == 200
        assert client.get("/").status_code == 404
        assert client.get("/ui/js/main.js").status_code == 404


def _serves_both(server: ServerProcess) -> None:
    page = httpx.get(f"{server.url}/", timeout=10)
    assert page.status_code == 200
    assert '<script type="module" src="/ui/js/main.js">' in page.text
    version = httpx.get(f"{server.url}/v1/version", timeout=10)
    assert version.status_code == 200, version.text


def test_the_server_serves_the_dashboard_and_the_api(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "home") as server:
        _serves_both(server)


def test_two_workers_serve_the_dashboard_and_the_api(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "home", extra_args=("--workers", "2")) as server:
        _serves_both(server)
