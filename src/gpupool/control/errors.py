"""Errors the services raise on purpose; the API maps each to one HTTP status.

Every message says what is wrong and what to do about it.
"""

from __future__ import annotations

from gpupool.domain.errors import GpupoolError


class ServiceError(GpupoolError):
    """Base of the errors below. ``status`` is the HTTP status the API answers with."""

    status = 400
    title = "bad request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthorized(ServiceError):
    status = 401
    title = "unauthorized"


class Forbidden(ServiceError):
    status = 403
    title = "forbidden"


class NotFound(ServiceError):
    status = 404
    title = "not found"


class Conflict(ServiceError):
    status = 409
    title = "conflict"


class Invalid(ServiceError):
    status = 422
    title = "invalid request"


class Unavailable(ServiceError):
    status = 503
    title = "service unavailable"


class NotLeader(Unavailable):
    """This server lost (or never had) the scheduling lease; a stale leader must not write."""
