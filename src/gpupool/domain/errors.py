"""Errors a person can act on.

Every error raised for bad input carries a message that says what is wrong *and* what to do,
for example ``gpu memory "10 gigs" is not a memory size: use 10GiB or 10240MiB``.
"""

from __future__ import annotations


class GpupoolError(Exception):
    """Base class of every error gpupool raises on purpose."""


class InvalidValue(GpupoolError, ValueError):
    """A value someone typed (CLI, job file, API, config) is not acceptable.

    ``field`` names what was being parsed (``"gpus"``, ``"env.FOO"``); the message already
    contains the hint.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Problem:
    """One problem found in a job file or option set.

    ``line`` is the 1-based line in ``source`` or ``None`` when the input had no lines
    (CLI options, an API request). Immutable and compared by value, like the domain's frozen
    dataclasses, but written out: every CLI command imports this module, and importing
    :mod:`dataclasses` (and :mod:`inspect` with it) costs a ``gpupool queue`` more than its
    request (issue 27).
    """

    __slots__ = ("key", "line", "message", "source")
    key: str
    message: str
    line: int | None
    source: str | None

    def __init__(
        self, key: str, message: str, line: int | None = None, source: str | None = None
    ) -> None:
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "message", message)
        object.__setattr__(self, "line", line)
        object.__setattr__(self, "source", source)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Problem is immutable: cannot set {name}")

    def _fields(self) -> tuple[str, str, int | None, str | None]:
        return (self.key, self.message, self.line, self.source)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Problem) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Problem(key={self.key!r}, message={self.message!r}, line={self.line!r}, "
            f"source={self.source!r})"
        )

    def __str__(self) -> str:
        where = ""
        if self.source is not None and self.line is not None:
            where = f"{self.source}:{self.line}: "
        elif self.source is not None:
            where = f"{self.source}: "
        elif self.line is not None:
            where = f"line {self.line}: "
        return f"{where}{self.key}: {self.message}"


class SpecError(GpupoolError, ValueError):
    """A job spec failed validation; ``problems`` lists every problem found, not just the first."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in problems))


class InvalidTransition(GpupoolError):
    """A job state change that the transition table does not allow."""

    def __init__(self, job_id: str, source: str, target: str) -> None:
        super().__init__(
            f"job {job_id} cannot go from {source} to {target}: "
            "that move is not in the state table (see docs/architecture.md)"
        )
        self.job_id = job_id
        self.source = source
        self.target = target
