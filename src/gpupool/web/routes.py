"""Serving the dashboard: ``/`` is the page, ``/ui/...`` its static assets.

The dashboard is a single page of hand-written JavaScript modules and CSS under
``gpupool/web/static`` (shipped as package data, no CDN, no build step). The browser talks to
the public API only (``/v1/...`` with the user's bearer token, and ``/metrics`` for device
telemetry), so this router holds no logic and no credentials: it hands out files.

Words:

- **asset**: a file under ``static/`` served at ``/ui/<path>``.
- **shell**: ``index.html``, served at ``/`` and ``/ui/`` with a strict content security policy
  (scripts, styles and connections from this origin only), so a pool without internet works
  and an injected string cannot load code from elsewhere.

Assets are served with ``Cache-Control: no-cache`` plus an ``ETag`` from the file's size and
modification time: the browser revalidates cheaply and never runs a stale dashboard after an
upgrade.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

STATIC_DIR = Path(__file__).resolve().parent / "static"

#: Where the dashboard's assets live in URL space.
ASSET_PREFIX = "/ui"

#: Scripts, styles, images and API calls from this origin only; no inline script.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)

#: Types the standard table may not know on a minimal system.
_TYPES = {
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".html": "text/html",
    ".json": "application/json",
    ".ico": "image/x-icon",
}

router = APIRouter(include_in_schema=False)


def resolve_asset(path: str, root: Path = STATIC_DIR) -> Path | None:
    """The file under ``root`` that ``path`` names, or ``None`` when there is none.

    Paths that climb out of ``root`` (``..``, absolute paths, symlinks pointing elsewhere)
    and folders resolve to ``None``, so a request can never read outside the assets.
    """
    if not path or "\x00" in path:
        return None
    base = root.resolve()
    candidate = (base / path).resolve()
    if base not in candidate.parents or not candidate.is_file():
        return None
    return candidate


def _etag(file: Path) -> str:
    st = file.stat()
    return f'"{st.st_size:x}-{st.st_mtime_ns:x}"'


def _serve(request: Request, file: Path, *, shell: bool = False) -> Response:
    etag = _etag(file)
    headers = {
        "Cache-Control": "no-cache",
        "ETag": etag,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    if shell:
        headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        headers["X-Frame-Options"] = "DENY"
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    media = _TYPES.get(file.suffix) or mimetypes.guess_type(file.name)[0]
    return FileResponse(file, media_type=media or "application/octet-stream", headers=headers)


def _not_found(path: str) -> Response:
    return Response(
        f"no dashboard asset {path!r}: the dashboard starts at /",
        status_code=404,
        media_type="text/plain",
    )


@router.get("/")
@router.get(f"{ASSET_PREFIX}/")
def index(request: Request) -> Response:
    """The dashboard page (its views are chosen by the URL fragment, e.g. ``/#/jobs``)."""
    return _serve(request, STATIC_DIR / "index.html", shell=True)


@router.get(f"{ASSET_PREFIX}/{{path:path}}")
def asset(path: str, request: Request) -> Response:
    """One static asset of the dashboard."""
    file = resolve_asset(path)
    if file is None:
        return _not_found(path)
    return _serve(request, file, shell=file.name == "index.html")
