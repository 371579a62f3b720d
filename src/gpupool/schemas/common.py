"""Wire parts shared by several endpoints: errors and pages.

Errors follow RFC 9457 (``application/problem+json``): ``title`` names the kind of error,
``detail`` says what is wrong and what to do, ``status`` repeats the HTTP status, and
``errors`` lists per-field problems for validation failures.
"""

from __future__ import annotations

from pydantic import Field

from gpupool.schemas.base import WireModel


class FieldProblem(WireModel):
    field: str
    message: str


class Problem(WireModel):
    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldProblem] = Field(default_factory=list)


class Created(WireModel):
    """Answer of a create-or-replace: the name, and whether it was new."""

    name: str
    created: bool
