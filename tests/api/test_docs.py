"""``/docs`` of a real server works offline: no script, style or font from another host."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.api.server_proc import ServerProcess


def test_the_api_docs_page_of_a_running_server_needs_no_internet(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "home") as server:
        page = httpx.get(server.url + "/docs", timeout=30)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        html = page.text
        # Nothing is fetched from anywhere: no external src/href, no script at all.
        assert re.findall(r"""(?:src|href)=["']?(?:https?:)?//""", html) == []
        assert "<script" not in html
        assert "/v1/jobs" in html
        assert "POST" in html
        assert 'href="/openapi.json"' in html
        document = httpx.get(server.url + "/openapi.json", timeout=30)
        assert document.status_code == 200
        assert "/v1/jobs" in document.json()["paths"]
        # Every schema a page links to is on the page.
        targets = set(re.findall(r'href="#(schema-[^"]+)"', html))
        assert targets
        assert all(f'id="{t}"' in html for t in targets)
