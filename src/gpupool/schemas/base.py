"""The base of every wire model.

Every request and response is a pydantic model that rejects unknown fields (``extra="forbid"``),
so a typo in a client is an error with the field's name instead of a silently ignored value.
Requests end in ``Request``; responses and shared parts have plain names.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    """A wire message: strict about unknown fields, immutable once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)
