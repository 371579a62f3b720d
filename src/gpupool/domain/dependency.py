"""Job dependencies, in Slurm's spelling (``sbatch --dependency``), and when one is met.

A **dependency** is a list of **terms**, all of which must be met (Slurm's ``,``) or any one
of which suffices (Slurm's ``?``; the two separators are not mixed). A term is a **kind** and,
but for ``singleton``, one or more **targets** (job ids or array ids, ``:``-separated):

- ``after:ID``: the target has started (or ended);
- ``afterany:ID``: the target has ended, however;
- ``afterok:ID``: the target has completed (exit code 0); any other end can never meet it;
- ``afternotok:ID``: the target has ended in a failure (failed, cancelled, timed out, node
  failure, out of memory, boot failure, preempted); a completion can never meet it;
- ``aftercorr:ARRAY``: for a task of a job array, the task with the same index of ``ARRAY``
  has completed (``afterok`` task by task); a task with no such index has nothing to wait for;
- ``singleton``: no earlier job with the same name and user is still pending or running.

A target that is an **array id** stands for every task of that array. A dependency that can
never be met (``afterok`` on a failed job) is **never satisfied**: the control plane ends the
job (``DependencyNeverSatisfied``), and as that end is itself a failure, an ``afterok`` chain
behind it ends with it.

:func:`evaluate` is pure: it is given what it needs to know of the targets (a
:class:`Target` per id: its state, whether it ever started) and answers a :class:`Standing`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpupool.domain.errors import InvalidValue
from gpupool.domain.states import JobState

#: At most this many targets in one dependency (Slurm has no small bound; a store query names
#: them all).
MAX_TARGETS = 1000
_ID_RE = re.compile(r"^[0-9a-zA-Z_-]{1,64}$")


class DependencyKind(enum.Enum):
    AFTER = "after"
    AFTER_ANY = "afterany"
    AFTER_OK = "afterok"
    AFTER_NOT_OK = "afternotok"
    AFTER_CORR = "aftercorr"
    SINGLETON = "singleton"


@dataclass(frozen=True)
class Term:
    kind: DependencyKind
    targets: tuple[str, ...] = ()

    def text(self) -> str:
        return ":".join((self.kind.value, *self.targets))


@dataclass(frozen=True)
class Dependency:
    """``terms`` all to be met (``any_of`` False, Slurm's ``,``) or any one (``?``)."""

    terms: tuple[Term, ...]
    any_of: bool = False

    def text(self) -> str:
        return ("?" if self.any_of else ",").join(t.text() for t in self.terms)

    @property
    def targets(self) -> tuple[str, ...]:
        """Every id named, once, in order."""
        return tuple(dict.fromkeys(i for t in self.terms for i in t.targets))


_HINT = "write it like afterok:ID[:ID...], afterany:ID, afternotok:ID, aftercorr:ID or singleton"


def parse_dependency(text: str) -> Dependency:
    """``afterok:a1:b2,afterany:c3`` -> :class:`Dependency`; raises ``InvalidValue``."""
    raw = text.strip()
    if not raw:
        raise InvalidValue(f"dependency is empty: {_HINT}", field="dependency")
    if "," in raw and "?" in raw:
        raise InvalidValue(
            f"dependency {text!r} mixes ',' (all) and '?' (any): use one of them",
            field="dependency",
        )
    any_of = "?" in raw
    terms: list[Term] = []
    count = 0
    for part in raw.split("?" if any_of else ","):
        words = part.strip().split(":")
        name = words[0].strip().lower()
        kinds = {k.value: k for k in DependencyKind}
        if name not in kinds:
            raise InvalidValue(
                f"dependency {text!r}: {words[0]!r} is not a dependency kind: {_HINT}",
                field="dependency",
            )
        kind = kinds[name]
        targets = tuple(w.strip() for w in words[1:])
        if kind is DependencyKind.SINGLETON:
            if targets:
                raise InvalidValue(
                    f"dependency {text!r}: singleton takes no job id", field="dependency"
                )
        elif not targets or any(not _ID_RE.match(t) for t in targets):
            raise InvalidValue(
                f"dependency {text!r}: {name} needs job ids after ':', like {name}:3f2a9c01b7de",
                field="dependency",
            )
        count += len(targets)
        terms.append(Term(kind, targets))
    if count > MAX_TARGETS:
        raise InvalidValue(
            f"dependency names {count} jobs, more than {MAX_TARGETS}: depend on a job array's "
            "id instead of each task",
            field="dependency",
        )
    return Dependency(tuple(terms), any_of)


@dataclass(frozen=True)
class Target:
    """What a dependency needs to know of one target job."""

    id: str
    state: JobState
    started: bool  # it has run (a start time), now or before
    array_index: int | None = None


class Standing(enum.Enum):
    MET = "met"
    WAITING = "waiting"
    NEVER = "never"


@dataclass(frozen=True)
class Verdict:
    standing: Standing
    message: str = ""


_FAILED = frozenset(
    {
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.OUT_OF_MEMORY,
        JobState.BOOT_FAIL,
        JobState.PREEMPTED,
    }
)


def _one(kind: DependencyKind, t: Target) -> Verdict:
    ended = t.state.is_terminal
    if kind is DependencyKind.AFTER:
        if t.started or ended:
            return Verdict(Standing.MET)
        return Verdict(Standing.WAITING, f"waits for job {t.id} to start")
    if kind is DependencyKind.AFTER_ANY:
        if ended:
            return Verdict(Standing.MET)
        return Verdict(Standing.WAITING, f"waits for job {t.id} to end ({t.state.value} now)")
    if kind in (DependencyKind.AFTER_OK, DependencyKind.AFTER_CORR):
        if t.state is JobState.COMPLETED:
            return Verdict(Standing.MET)
        if ended:
            return Verdict(
                Standing.NEVER,
                f"{kind.value}: job {t.id} ended {t.state.value}, not COMPLETED",
            )
        return Verdict(Standing.WAITING, f"waits for job {t.id} to complete ({t.state.value} now)")
    # AFTER_NOT_OK
    if t.state in _FAILED:
        return Verdict(Standing.MET)
    if ended:
        return Verdict(Standing.NEVER, f"afternotok: job {t.id} COMPLETED, it did not fail")
    return Verdict(Standing.WAITING, f"waits for job {t.id} to fail ({t.state.value} now)")


def _term(
    term: Term,
    targets: Callable[[str], Sequence[Target]],
    index: int | None,
    singleton_blocker: str | None,
) -> Verdict:
    if term.kind is DependencyKind.SINGLETON:
        if singleton_blocker is None:
            return Verdict(Standing.MET)
        return Verdict(
            Standing.WAITING,
            f"singleton: waits for job {singleton_blocker} of the same name and user to end",
        )
    waiting: list[str] = []
    for target_id in term.targets:
        found = targets(target_id)
        if term.kind is DependencyKind.AFTER_CORR:
            found = [t for t in found if t.array_index == index] if index is not None else []
        for t in found:
            v = _one(term.kind, t)
            if v.standing is Standing.NEVER:
                return v
            if v.standing is Standing.WAITING:
                waiting.append(v.message)
    if waiting:
        more = f" (and {len(waiting) - 1} more)" if len(waiting) > 1 else ""
        return Verdict(Standing.WAITING, f"{term.kind.value}: {waiting[0]}{more}")
    return Verdict(Standing.MET)


def evaluate(
    dependency: Dependency,
    targets: Callable[[str], Sequence[Target]],
    *,
    array_index: int | None = None,
    singleton_blocker: str | None = None,
) -> Verdict:
    """Is ``dependency`` met, to wait for, or never to be met?

    ``targets(id)``: the jobs an id stands for (one job, or an array's tasks; none for an id
    the store no longer has, which counts as met). ``array_index``: the waiting job's own index
    (for ``aftercorr``). ``singleton_blocker``: an earlier unfinished job of the same name and
    user, if any."""
    verdicts = [_term(t, targets, array_index, singleton_blocker) for t in dependency.terms]
    if dependency.any_of:
        if any(v.standing is Standing.MET for v in verdicts):
            return Verdict(Standing.MET)
        waiting = [v for v in verdicts if v.standing is Standing.WAITING]
        if waiting:
            return waiting[0]
        return Verdict(Standing.NEVER, "; ".join(v.message for v in verdicts))
    for v in verdicts:
        if v.standing is Standing.NEVER:
            return v
    for v in verdicts:
        if v.standing is Standing.WAITING:
            return v
    return Verdict(Standing.MET)


_BEGIN_UNITS = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "days": 86400.0,
    "w": 604800.0,
    "weeks": 604800.0,
}
_BEGIN_RE = re.compile(r"^now(?:\+(\d{1,9})([a-z]*))?$")
_BEGIN_HINT = (
    "use now+90 (seconds), now+2hours, 16:00, 2026-12-24 or 2026-12-24T08:00 (local time), "
    "as sbatch --begin does"
)


def parse_begin(text: str, now: float) -> float:
    """``sbatch --begin``'s forms -> epoch seconds, at or after ``now``.

    ``now+N`` with an optional unit (seconds by default; ``minutes``, ``hours``, ``days``,
    ``weeks`` and their short forms), ``HH:MM[:SS]`` (today, or tomorrow once that time has
    passed), ``YYYY-MM-DD[THH:MM[:SS]]``; all in local time. Raises ``InvalidValue``."""
    import datetime as dt

    raw = text.strip().lower()
    found = _BEGIN_RE.match(raw)
    if found:
        count, unit = found.groups()
        if count is None:
            return now
        unit = unit if unit in _BEGIN_UNITS else unit + "s"  # hour, day: as Slurm takes them
        if unit not in _BEGIN_UNITS:
            raise InvalidValue(
                f"--begin {text!r}: {unit!r} is not a unit: {_BEGIN_HINT}", field="begin"
            )
        return now + int(count) * _BEGIN_UNITS[unit]
    here = dt.datetime.fromtimestamp(now).astimezone()
    try:
        if re.match(r"^\d{1,2}:\d{2}(:\d{2})?$", raw):
            clock = dt.time.fromisoformat(raw.zfill(5) if len(raw) == 4 else raw)
            at = here.replace(
                hour=clock.hour, minute=clock.minute, second=clock.second, microsecond=0
            )
            if at.timestamp() < now:
                at += dt.timedelta(days=1)
            return at.timestamp()
        when = dt.datetime.fromisoformat(raw.upper() if "t" in raw else raw)
    except ValueError:
        raise InvalidValue(
            f"--begin {text!r} is not a time: {_BEGIN_HINT}", field="begin"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()
    if not 0 <= when.timestamp() <= 253402300799:
        raise InvalidValue(f"--begin {text!r} is out of range: {_BEGIN_HINT}", field="begin")
    return max(now, when.timestamp())
