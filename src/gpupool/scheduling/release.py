"""``Release``: a running replica's end on the backfill timeline, and what it frees.

Its own module, below both :mod:`~gpupool.scheduling.memo` (which keeps each running replica's
release across cycles) and :mod:`~gpupool.scheduling.reservation` (whose timeline orders them),
so that neither imports the other: ``capacity`` -> ``memo`` -> ``release`` and ``reservation``
-> ``capacity``, with no circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.scheduling.placement.base import Choice, Shape


@dataclass(frozen=True)
class Release:
    """A running replica ending at ``time`` (``None`` = unknown) and what it frees.

    ``order`` is its place on a timeline: by time (unknown last), then node and slots.
    """

    time: float | None
    shape: Shape
    choice: Choice
    order: tuple[bool, float, int, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        t = self.time
        order = (t is None, t or 0.0, self.choice.node, self.choice.slots)
        object.__setattr__(self, "order", order)
