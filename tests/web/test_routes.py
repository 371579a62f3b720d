"""The router that serves the dashboard, and the integrity of its assets (no browser)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gpupool.web.routes import CONTENT_SECURITY_POLICY, STATIC_DIR, resolve_asset, router
from tests.web.a11y import contrast


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    app.include_router(router)
    return TestClient(app)


def test_root_serves_the_page_with_a_strict_content_security_policy(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert '<script type="module" src="/ui/js/main.js">' in r.text


def test_assets_have_their_types_and_revalidate_by_etag(client: TestClient) -> None:
    js = client.get("/ui/js/main.js")
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/css/app.css").headers["content-type"].startswith("text/css")
    again = client.get("/ui/js/main.js", headers={"If-None-Match": js.headers["etag"]})
    assert again.status_code == 304
    assert again.content == b""


@pytest.mark.parametrize(
    "path", ["../routes.py", "..%2froutes.py", "%2fetc/passwd", "js", "js/", "missing.js", "a%00b"]
)
def test_paths_outside_the_assets_or_missing_are_404(client: TestClient, path: str) -> None:
    assert resolve_asset(unquote(path)) is None
    r = client.get(f"/ui/{path}")
    assert r.status_code == 404
    assert "routes" not in r.text or "dashboard starts at /" in r.text


def test_symlink_out_of_the_asset_folder_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "static"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("no")
    (root / "link.txt").symlink_to(tmp_path / "secret.txt")
    (root / "ok.txt").write_text("yes")
    assert resolve_asset("link.txt", root) is None
    assert resolve_asset("ok.txt", root) == (root / "ok.txt").resolve()


def test_every_module_import_and_page_reference_resolves() -> None:
    """A missing or misspelt module would break the whole page: check each reference."""
    refs: list[tuple[Path, str]] = []
    for js in STATIC_DIR.rglob("*.js"):
        for spec in re.findall(r"""^import .*? from '(\.[^']+)';""", js.read_text(), re.M):
            refs.append((js, str((js.parent / spec).resolve())))
    html = (STATIC_DIR / "index.html").read_text()
    for url in re.findall(r"""(?:src|href)="/ui/([^"]+)\"""", html):
        refs.append((STATIC_DIR / "index.html", str(STATIC_DIR / url)))
    assert len(refs) > 10
    missing = [(str(src), target) for src, target in refs if not Path(target).is_file()]
    assert not missing


def test_no_asset_loads_anything_from_another_origin() -> None:
    for file in STATIC_DIR.rglob("*"):
        if file.suffix in (".js", ".css", ".html"):
            text = file.read_text()
            assert not re.search(r"""(src|href|url)\s*[=(]\s*["']?(https?:)?//""", text), file


def test_contrast_matches_the_wcag_reference_values() -> None:
    assert contrast("rgb(0, 0, 0)", "rgb(255, 255, 255)") == pytest.approx(21.0)
    assert contrast("rgb(255, 255, 255)", "rgb(255, 255, 255)") == pytest.approx(1.0)
    # #767676 on white is the classic just-passing grey (4.54:1).
    assert contrast("rgb(118, 118, 118)", "rgb(255, 255, 255)") == pytest.approx(4.54, abs=0.01)
