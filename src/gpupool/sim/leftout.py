"""What a trace reader leaves out, counted, and the notes it leaves for the user.

Readers of a user's own file (:mod:`~gpupool.sim.trace_slurm`, :mod:`~gpupool.sim.trace_csv`)
read each row through :meth:`LeftOut.read`: a row that is not a job to replay returns the reason
(counted under it), a row that cannot be read raises :class:`TraceFormatError` (counted as
``unparseable``, the first kept to quote). :meth:`LeftOut.notes` says what happened in words.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn, TypeVar

from gpupool.sim.alibaba import TraceFormatError

T = TypeVar("T")

UNPARSEABLE = "unparseable"


class LeftOut:
    """Counts per reason (in the order given, ``unparseable`` last) and the first bad row."""

    def __init__(self, *reasons: str) -> None:
        self.counts = dict.fromkeys((*reasons, UNPARSEABLE), 0)
        self.first_bad: TraceFormatError | None = None

    def read(self, row: Callable[[], T | str | None]) -> T | None:
        """``row()``'s record, or ``None`` when it was left out (counted) or is no job at all."""
        try:
            record = row()
        except TraceFormatError as exc:
            self.counts[UNPARSEABLE] += 1
            self.first_bad = self.first_bad or exc
            return None
        if isinstance(record, str):
            self.counts[record] += 1
            return None
        return record

    def refuse_empty(self, path: Path, message: str) -> NoReturn:
        """Called when nothing was kept: the first bad row's error, else ``message``."""
        if self.first_bad is not None:
            raise self.first_bad
        raise TraceFormatError(path, message, line=None, column=None)

    def notes(self, names: Mapping[str, str], what: str) -> tuple[str, ...]:
        """The first bad row quoted, and the ``what`` (accounts, teams) renamed in ``names``."""
        found: list[str] = []
        if self.first_bad is not None:
            found.append(
                f"{self.counts[UNPARSEABLE]} unparseable rows left out, the first: {self.first_bad}"
            )
        renamed = [f"{a} -> {n}" for a, n in names.items() if a != n]
        if renamed:
            found.append(f"{what} renamed to tenant names: " + ", ".join(renamed))
        return tuple(found)
