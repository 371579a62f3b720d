"""The base of every wire model.

Every request and response is a pydantic model that rejects unknown fields (``extra="forbid"``),
so a typo in a client is an error with the field's name instead of a silently ignored value.
Requests end in ``Request``; responses and shared parts have plain names.

Answers are read the other way round: a client (the SDK, the CLI, an agent) reads what a server
sent with :func:`read_answer`, which ignores fields it does not know, at every depth. In a
rolling upgrade the server is newer than the nodes and the users' CLIs, and every field a newer
server adds to an answer would otherwise make this version's clients fail.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter

M = TypeVar("M", bound=BaseModel)


class WireModel(BaseModel):
    """A wire message: strict about unknown fields, immutable once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def read_answer(model: type[M], data: Any) -> M:
    """``data`` (a server's decoded JSON answer) as ``model``, ignoring fields it does not know."""
    return model.model_validate(data, extra="ignore")


def read_answers(model: type[M], data: Any) -> list[M]:
    """A JSON list of ``model`` answers, read as :func:`read_answer` reads one."""
    return TypeAdapter(list[model]).validate_python(data, extra="ignore")  # type: ignore[valid-type]
