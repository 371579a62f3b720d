"""The parsers of a job file's single values, and the collector of their problems.

Each ``as_*`` function turns one raw value of a job file or an option (text, a number, a list,
as YAML or the CLI gives it) into the typed value a :class:`~gpupool.domain.jobs.JobSpec`
holds, or raises :class:`~gpupool.domain.errors.InvalidValue` with a message that says what
to write instead. :class:`Collector` runs them for :func:`gpupool.domain.jobspec.build_spec`,
keeping every problem (with its key, and the line of a job file) instead of stopping at the
first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from gpupool.domain.bounds import JOB_DURATION_S, exec_text
from gpupool.domain.errors import InvalidValue, Problem
from gpupool.domain.jobs import IsolationMode, RequeuePolicy
from gpupool.domain.units import parse_duration

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Collector:
    """Gathers problems with their line numbers while a spec is built."""

    def __init__(self, source: str | None, lines: Mapping[str, int]) -> None:
        self.source = source
        self.lines = lines
        self.problems: list[Problem] = []

    def add(self, key: str, message: str) -> None:
        self.problems.append(Problem(key, message, self.lines.get(key), self.source))

    def parse(self, key: str, raw: object, parser: Callable[[Any], Any]) -> Any:
        try:
            return parser(raw)
        except (InvalidValue, ValueError, TypeError) as exc:
            self.add(key, str(exc))
            return None


def as_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise InvalidValue(f"{raw!r} is not true or false")


def as_int(raw: object, *, low: int, high: int, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise InvalidValue(f"{raw!r} is not a whole number: give {what} as an integer")
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidValue(f"{raw!r} is not a whole number: give {what} as an integer") from None
    if not low <= value <= high:
        raise InvalidValue(f"{value} is out of range: {what} must be between {low} and {high}")
    return value


def as_str(raw: object, what: str) -> str:
    if isinstance(raw, (dict, list)) or raw is None:
        raise InvalidValue(f"expected text for {what}, got {type(raw).__name__}")
    return str(raw)


def as_requeue(raw: object) -> RequeuePolicy:
    if isinstance(raw, bool):
        return RequeuePolicy.ON_PREEMPTION if raw else RequeuePolicy.NEVER
    text = str(raw).strip().lower().replace("_", "-")
    for policy in RequeuePolicy:
        if policy.value == text:
            return policy
    choices = ", ".join(p.value for p in RequeuePolicy)
    raise InvalidValue(f"{raw!r} is not a requeue policy: use {choices}, true or false")


def as_isolation(raw: object) -> IsolationMode:
    text = str(raw).strip().lower()
    for mode in IsolationMode:
        if mode.value == text:
            return mode
    choices = ", ".join(m.value for m in IsolationMode)
    raise InvalidValue(f"{raw!r} is not an isolation mode: use one of {choices}")


def as_argv(raw: object) -> tuple[str, ...]:
    if isinstance(raw, str):
        raise InvalidValue(
            "command must be a list of arguments, like [python, train.py]; "
            "to run a shell line, use 'script' instead"
        )
    if not isinstance(raw, list) or not raw:
        raise InvalidValue("command must be a non-empty list of arguments, like [python, train.py]")
    argv: list[str] = []
    for i, item in enumerate(raw):
        if isinstance(item, (dict, list)) or item is None:
            raise InvalidValue('every command argument must be text; quote numbers like "10"')
        argv.append(exec_text(str(item), field=f"command argument {i}"))
    if not argv[0]:
        raise InvalidValue("the program (first argument of command) is empty")
    return tuple(argv)


def as_types(raw: object) -> tuple[str, ...]:
    items = raw.split("|") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        raise InvalidValue("gpu_types must be a list like [A100, H100] or text like 'A100|H100'")
    out = tuple(str(i).strip() for i in items if str(i).strip())
    for item in out:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$", item):
            raise InvalidValue(f"GPU type {item!r} is not valid: use a model name like A100")
    return out


NODE_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def as_nodes(raw: object, key: str) -> tuple[str, ...]:
    """``n1,n2`` or ``[n1, n2]`` -> node names (lowercase DNS labels, as agents register)."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        raise InvalidValue(f"{key} must be node names like n1,n2 or a list [n1, n2]")
    out = tuple(dict.fromkeys(str(i).strip() for i in items if str(i).strip()))
    for item in out:
        if not NODE_RE.match(item):
            raise InvalidValue(
                f"{key}: {item!r} is not a node name: use the names gpupool nodes lists"
            )
    if len(out) > 1000:
        raise InvalidValue(f"{key} names {len(out)} nodes: at most 1000")
    return out


def as_positive_duration(raw: object, key: str) -> float:
    value = JOB_DURATION_S.check(parse_duration(raw, field=key), field=key)
    if value <= 0:
        raise InvalidValue(f"{key} must be longer than 0")
    return value


def exec_size(command: tuple[str, ...], script: str | None, env: Mapping[str, str]) -> int:
    """Bytes the program's argv and environment take at exec (each string and its NUL)."""
    strings = [*command, *(("/bin/sh", "-c", script) if script is not None else ())]
    strings += [f"{k}={v}" for k, v in env.items()]
    return sum(len(x.encode("utf-8", "surrogateescape")) + 1 for x in strings)


def as_bool_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
