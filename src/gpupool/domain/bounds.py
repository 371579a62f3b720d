"""Bounds on every number that enters gpupool, in one place.

A number reaches gpupool as text or JSON from people and programs (API bodies, query strings,
headers, job files, CLI flags, config files). Before it is used it must be:

- **short**: at most :data:`MAX_NUMBER_CHARS` characters of text (a 400-digit ``gpus`` made
  ``round(float(...))`` raise ``OverflowError``, a 500);
- **finite**: no ``inf`` or ``nan`` (JSON's ``1e999`` parses to infinity);
- **in range**: each quantity has a :class:`Bound` here, and the error names the quantity,
  the limit in its unit and what to do.

The parsers of :mod:`gpupool.domain.units` apply the first two to everything they read; the
job-spec builder and the wire schemas apply the ranges below. Rows stored before these rules
are read as they are (views format them; nothing re-validates a stored spec), so an old job
with a huge number still lists and cancels.
"""

from __future__ import annotations

import math

from gpupool.domain.errors import InvalidValue

#: The longest number text accepted (``1e20`` or 20 digits is already far past any limit).
MAX_NUMBER_CHARS = 24

_MIB_PER_TIB = 1024 * 1024  # as in gpupool.domain.units, which imports this module
DAY_S = 86400.0


class Bound:
    """The accepted range of one quantity: ``low <= value <= high``, both in ``unit``.

    ``shown_high`` is the limit as people write it (``1TiB``, not 1048576). Immutable; a plain
    class rather than a frozen dataclass because every CLI command imports this module and
    importing :mod:`dataclasses` costs ``gpupool queue`` more than its request (issue 27)."""

    __slots__ = ("high", "hint", "low", "shown_high", "unit", "what")
    what: str
    low: float
    high: float
    unit: str
    shown_high: str
    hint: str

    def __init__(  # noqa: PLR0917 - the bound's parts, as the dataclass took them
        self, what: str, low: float, high: float, unit: str, shown_high: str, hint: str
    ) -> None:
        for name, value in (
            ("what", what),
            ("low", low),
            ("high", high),
            ("unit", unit),
            ("shown_high", shown_high),
            ("hint", hint),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Bound is immutable: cannot set {name}")

    def _fields(self) -> tuple[str, float, float, str, str, str]:
        return (self.what, self.low, self.high, self.unit, self.shown_high, self.hint)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Bound) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"Bound({self.what!r}, {self.low!r}, {self.high!r}, {self.unit!r})"

    def check(self, value: float, *, field: str | None = None) -> float:
        """``value`` when it is finite and within the bound; else :class:`InvalidValue`."""
        name = field or self.what
        if not math.isfinite(value):
            raise InvalidValue(f"{name} must be a finite number: {self.hint}", field=name)
        if value < self.low:
            raise InvalidValue(
                f"{name} is less than {self.low:g}{self.unit}: {self.hint}", field=name
            )
        if value > self.high:
            raise InvalidValue(f"{name} is more than {self.shown_high}: {self.hint}", field=name)
        return value


#: Per replica: 64 whole GPUs (larger jobs use replicas).
GPU_MILLI = Bound("gpus", 0, 64_000, "m", "64 GPUs per replica", "use replicas for larger jobs")
#: Per device: no card has 1 TiB (the largest have under 200 GiB).
GPU_MEMORY_MIB = Bound(
    "gpu memory", 0, _MIB_PER_TIB, "MiB", "1TiB per device", "ask for at most the card's memory"
)
#: Host memory per replica.
HOST_MEMORY_MIB = Bound(
    "memory", 0, 64 * _MIB_PER_TIB, "MiB", "64TiB", "ask for at most the node's memory"
)
#: Host CPUs per replica, in milli-CPU.
CPU_MILLI = Bound("cpus", 0, 4096 * 1000, "m", "4096 CPUs", "ask for at most the node's CPUs")
#: ``time_limit`` and ``expected_duration``.
JOB_DURATION_S = Bound(
    "duration", 0, 366 * DAY_S, "s", "366 days", "give a limit of at most 366 days, like 30d"
)
#: ``checkpoint.grace``: how long a job may take to checkpoint once signalled.
GRACE_S = Bound("checkpoint.grace", 0, 3600.0, "s", "1h", "use a grace period of at most 1h")
#: Any other duration people type (``--since``, token lifetimes, windows): a century.
ANY_DURATION_S = Bound("duration", 0, 36_525 * DAY_S, "s", "100 years", "give a shorter duration")
#: A tenant's quota in one pool: a million GPUs (milli-GPU), 2^50 MiB of GPU memory.
QUOTA_MILLI_MAX = 10**9
QUOTA_MEMORY_MIB_MAX = 2**50
#: A GPU-hour budget, and the window it is counted over.
BUDGET_GPU_HOURS_MAX = 1e12
BUDGET_WINDOW_S_MAX = 3650 * DAY_S
#: A price per GPU-hour (any currency): far above any real one, far below overflow.
PRICE_PER_GPU_HOUR_MAX = 1e6
#: Epoch seconds in query strings and bodies (``since``, ``start``): year 1970 to 9999.
EPOCH_S = Bound("time", 0, 253_402_300_799.0, "s", "the year 9999", "give epoch seconds")


#: The longest one argument (or one ``NAME=value`` of the environment, or a ``script``) may
#: be: Linux refuses a single exec string over MAX_ARG_STRLEN (32 pages, 128 KiB) with E2BIG.
MAX_ARG_BYTES = 128 * 1024 - 1
#: The most bytes a job's argv and environment may add up to: well below the kernel's ARG_MAX
#: (2 MiB with the usual 8 MiB stack), leaving room for what the agent adds.
MAX_EXEC_BYTES = 1024 * 1024


def exec_text(text: str, *, field: str) -> str:
    """``text`` when a program can receive it as one argument or variable: no NUL byte (exec
    cannot pass one) and at most :data:`MAX_ARG_BYTES` bytes; else :class:`InvalidValue`."""
    if "\x00" in text:
        raise InvalidValue(
            f"{field} contains a NUL byte, which no program can receive: remove it", field=field
        )
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > MAX_ARG_BYTES:
        raise InvalidValue(
            f"{field} is {size} bytes, more than the {MAX_ARG_BYTES} one argument may have "
            "(the kernel's limit): put the data in a file and pass its path, or send it with "
            "the job's working directory (--workdir)",
            field=field,
        )
    return text


def short_number(text: str, *, field: str, hint: str) -> str:
    """``text`` when it is at most :data:`MAX_NUMBER_CHARS` long; else :class:`InvalidValue`."""
    if len(text) > MAX_NUMBER_CHARS:
        raise InvalidValue(
            f"{field} has {len(text)} characters, more than the {MAX_NUMBER_CHARS} digits "
            f"a number may have: {hint}",
            field=field,
        )
    return text


def finite(value: float, *, field: str, hint: str) -> float:
    """``value`` when it is finite (no inf, no nan); else :class:`InvalidValue`."""
    if not math.isfinite(value):
        raise InvalidValue(f"{field} must be a finite number: {hint}", field=field)
    return value
