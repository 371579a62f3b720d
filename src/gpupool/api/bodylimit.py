"""A limit on request bodies: 413 with the limit and what to do, before a route reads more.

Without it a 50 MB job spec was read, parsed and stored. The limit (``DEFAULT_MAX_BODY_BYTES``)
is far above any real JSON request: a job's argv and environment are at most 1 MiB
(:data:`gpupool.domain.bounds.MAX_EXEC_BYTES`), a heartbeat of a full node a few hundred KiB,
a log chunk 256 KiB of base64. Working-directory archives (``POST /v1/uploads``) are exempt:
that route streams them against its own, larger limit (``upload_max_bytes``).

Both a declared ``Content-Length`` (read as a bounded number) and the bytes actually streamed
count, so a body without a length, or with a false one, is cut off at the limit too. The
refusal is raised as an HTTP error inside the app, so it is answered like every other error
(``application/problem+json``, audited; see :mod:`gpupool.api.errors`).
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The most bytes a request body may have (uploads excepted).
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: Paths that stream their body against a limit of their own.
EXEMPT_PATHS = frozenset({"/v1/uploads"})


class BodyTooLarge(HTTPException):
    """413: the body is over the limit; the detail says the limit and what to do."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            detail=(
                f"the request body is larger than the server's limit of {limit // 2**20} MiB "
                f"({limit} bytes): send a job's files with its working directory "
                "(gpupool submit --workdir, or POST /v1/uploads) and pass large data as files, "
                "not in the request"
            ),
        )


def _declared_length(scope: Scope) -> int | None:
    """The ``Content-Length`` header as a number, or ``None`` when absent or not a number.

    At most 19 digits are read (a longer one is over any limit anyway)."""
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            text = value.strip()
            if not text.isdigit():
                return None
            return int(text) if len(text) <= 19 else 10**19
    return None


class BodyLimitMiddleware:
    """ASGI middleware enforcing ``max_bytes`` on every HTTP request body but the exempt."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = _declared_length(scope)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            if declared is not None and declared > limit:
                raise BodyTooLarge(limit)
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited, send)
