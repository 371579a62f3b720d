"""Wire parts shared by several endpoints: errors, pages and bounded numbers.

Errors follow RFC 9457 (``application/problem+json``): ``title`` names the kind of error,
``detail`` says what is wrong and what to do, ``status`` repeats the HTTP status, and
``errors`` lists per-field problems for validation failures.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpupool.domain.bounds import (
    BUDGET_GPU_HOURS_MAX,
    BUDGET_WINDOW_S_MAX,
    PRICE_PER_GPU_HOUR_MAX,
    QUOTA_MEMORY_MIB_MAX,
    QUOTA_MILLI_MAX,
)
from gpupool.schemas.base import WireModel

# Numbers in request bodies, bounded as gpupool.domain.bounds says (finite, in range).
QuotaMilli = Annotated[int, Field(ge=0, le=QUOTA_MILLI_MAX, description="milli-GPU")]
QuotaMiB = Annotated[int, Field(ge=0, le=QUOTA_MEMORY_MIB_MAX, description="MiB")]
GpuHours = Annotated[float, Field(ge=0, le=BUDGET_GPU_HOURS_MAX, allow_inf_nan=False)]
WindowSeconds = Annotated[float, Field(gt=0, le=BUDGET_WINDOW_S_MAX, allow_inf_nan=False)]
Price = Annotated[float, Field(ge=0, le=PRICE_PER_GPU_HOUR_MAX, allow_inf_nan=False)]


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
