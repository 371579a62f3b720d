"""``/v1/uploads``: working-directory archives (see :mod:`gpupool.control.services.uploads`).

A client sends a gzip'd tar as the request body (``Content-Type: application/gzip``); a job
names the answer's ``upload_id`` in its submit's ``workdir_upload``. Node agents fetch it with
``GET /v1/agent/uploads/{id}``.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpupool.api.deps import Act, Svc, Who
from gpupool.control.errors import Invalid
from gpupool.control.services.uploads import TooLarge, too_large_message
from gpupool.schemas.jobs import UploadView

router = APIRouter(tags=["uploads"])

GZIP_TYPES = frozenset({"application/gzip", "application/x-gzip", "application/x-tar+gzip"})


@router.post("/v1/uploads", status_code=201, response_model=UploadView)
async def create_upload(request: Request, svc: Svc, act: Act) -> UploadView:
    """Store the body (a gzip'd tar of a folder) as an upload of the caller's tenant."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in GZIP_TYPES:
        raise Invalid(
            f"an upload must be a gzip'd tar sent as Content-Type: application/gzip, not "
            f"{kind or 'nothing'!r}: pack the folder with `tar czf` or use gpupool submit --workdir"
        )
    limit = svc.uploads.limit
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(too_large_message(limit))
    received: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # a body without (or with a wrong) Content-Length
            raise TooLarge(too_large_message(limit))
        received.append(chunk)
    up = await anyio.to_thread.run_sync(lambda: svc.uploads.create(act, received))
    return UploadView(upload_id=up.id, size=up.size, sha256=up.sha256)


@router.get("/v1/agent/uploads/{upload_id}", response_class=Response)
def download_upload(upload_id: str, svc: Svc, who: Who) -> Response:
    """The archive's bytes, for node agents (role ``agent``) only."""
    data = svc.uploads.data_for_agent(who, upload_id)
    return Response(content=data, media_type="application/gzip")
