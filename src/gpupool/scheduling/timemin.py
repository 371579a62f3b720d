"""``--time-min`` (Slurm's): backfill may start a job with a time limit shorter than its own,
down to its ``time_min``, when that lets it end before the pool's reservation.

A job whose end (its expected duration, else its time limit) would pass the reserved start is
held back by the backfill gate. With a ``time_min``, the scheduler tries again with the
longest limit that still ends by the reserved start: the reserved start minus now, capped by
the job's ``time_limit``, and at least its ``time_min`` (else it stays blocked). A job started
so runs with that limit (the start carries it, the store keeps it as the job's time limit, as
``scontrol show job`` shows Slurm's). Pure.
"""

from __future__ import annotations

import math

from gpupool.domain.jobs import JobSpec
from gpupool.scheduling.decision import Reservation


def shortened_limit(spec: JobSpec, reservation: Reservation | None, now: float) -> float | None:
    """The time limit (whole seconds) ``spec`` may backfill with before ``reservation``, or
    ``None`` when it has no ``time_min``, there is no reserved start, or even ``time_min``
    would pass it."""
    if spec.time_min_s is None or reservation is None or reservation.start_time is None:
        return None
    room = float(math.floor(reservation.start_time - now))
    if room < spec.time_min_s:
        return None
    return room if spec.time_limit_s is None else min(spec.time_limit_s, room)
