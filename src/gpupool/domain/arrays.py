"""Job arrays (like ``sbatch --array``): one submit, one job per index, for sweeps.

Words:

- an **array spec** is what a person types: ``0-9`` (a range, both ends included),
  ``0-20:5`` (a range with a step: 0, 5, 10, 15, 20), ``1,3,8-10`` (a list of those), as in
  Slurm. Indices are whole numbers from 0 to :data:`MAX_INDEX`; repeats count once; at most
  :data:`MAX_TASKS` tasks. A **throttle** ``%N`` after the spec (``0-99%4``, Slurm's) lets at
  most N tasks of the array run at once: the others wait with the reason ``JobArrayTaskLimit``
  (see :mod:`gpupool.control.machinery.dependencies`).
- a **task** is one job of the array: its ``index``, the array's ``array_id`` (shared by every
  task), ``count`` and the ``first`` and ``last`` index. A task is named ``NAME[INDEX]`` and gets
  ``GPUPOOL_ARRAY_*`` variables (see :mod:`gpupool.agent.env`); otherwise it is an ordinary job,
  queued, cancelled, held and accounted on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.domain.errors import InvalidValue

MAX_TASKS = 10_000
MAX_INDEX = 4_000_000


@dataclass(frozen=True)
class ArrayTask:
    """One task of an array (see the module docstring)."""

    array_id: str
    index: int
    count: int
    first: int
    last: int
    throttle: int | None = None  # at most this many tasks run at once (``%N``); None: no limit


def _index(text: str, spec: str) -> int:
    text = text.strip()
    if not text.isdigit():
        raise InvalidValue(
            f"array {spec!r}: {text!r} is not an index: use whole numbers, like 0-9 or 1,3,5",
            field="array",
        )
    value = int(text)
    if value > MAX_INDEX:
        raise InvalidValue(f"array {spec!r}: index {value} is above {MAX_INDEX:,}", field="array")
    return value


def array_throttle(spec: str) -> int | None:
    """The ``%N`` of an array spec (``0-99%4`` -> 4), or ``None``."""
    if "%" not in spec:
        return None
    text = spec.rpartition("%")[2].strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_TASKS:
        raise InvalidValue(
            f"array {spec!r}: the limit after % must be a whole number of tasks from 1 to "
            f"{MAX_TASKS}, like 0-99%4",
            field="array",
        )
    return int(text)


def parse_array(spec: str) -> tuple[int, ...]:
    """The sorted, distinct indices of an array spec such as ``0-9``, ``0-20:5`` or ``1,3,8-10``
    (a throttle ``%N`` after it is checked and left to :func:`array_throttle`)."""
    array_throttle(spec)
    spec = spec.partition("%")[0]
    indices: set[int] = set()
    for part in spec.split(","):
        if not part.strip():
            raise InvalidValue(
                f"array {spec!r}: an empty item: use ranges and indices like 0-9 or 1,3,5",
                field="array",
            )
        body, _, step_text = part.partition(":")
        low_text, dash, high_text = body.partition("-")
        low = _index(low_text, spec)
        high = _index(high_text, spec) if dash else low
        step = _index(step_text, spec) if step_text else 1
        if high < low:
            raise InvalidValue(
                f"array {spec!r}: range {part.strip()!r} ends before it starts", field="array"
            )
        if step < 1:
            raise InvalidValue(f"array {spec!r}: a step must be at least 1", field="array")
        if (high - low) // step + 1 + len(indices) > MAX_TASKS:
            raise InvalidValue(
                f"array {spec!r} has more than {MAX_TASKS:,} tasks: split it", field="array"
            )
        indices.update(range(low, high + 1, step))
    return tuple(sorted(indices))


def array_tasks(
    array_id: str, indices: tuple[int, ...], throttle: int | None = None
) -> tuple[ArrayTask, ...]:
    """A task per index of one array."""
    first, last = indices[0], indices[-1]
    return tuple(ArrayTask(array_id, i, len(indices), first, last, throttle) for i in indices)


def task_name(name: str, index: int) -> str:
    """``NAME[INDEX]``, the name a task is queued under (as Slurm shows ``JOBID_INDEX``)."""
    return f"{name}[{index}]"
