"""Array specs (``sbatch --array`` syntax) and the tasks they make."""

from __future__ import annotations

import pytest

from gpupool.domain.arrays import MAX_TASKS, array_tasks, parse_array, task_name
from gpupool.domain.errors import InvalidValue


@pytest.mark.parametrize(
    ("spec", "indices"),
    [
        ("0-3", (0, 1, 2, 3)),
        ("7", (7,)),
        ("0-20:5", (0, 5, 10, 15, 20)),
        ("1,3,8-10", (1, 3, 8, 9, 10)),
        ("5,1-3,2", (1, 2, 3, 5)),  # sorted, repeats once
        (" 0 - 2 ", (0, 1, 2)),
        ("0-3%2", (0, 1, 2, 3)),  # the throttle is array_throttle's
    ],
)
def test_specs_give_sorted_distinct_indices(spec: str, indices: tuple[int, ...]) -> None:
    assert parse_array(spec) == indices


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("0-9%0", "the limit after % must be a whole number of tasks from 1"),
        ("0-9%x", "the limit after % must be a whole number of tasks from 1"),
        ("a-b", "'a' is not an index"),
        ("-1", "'' is not an index"),
        ("5-2", "ends before it starts"),
        ("0-10:0", "a step must be at least 1"),
        ("1,,2", "an empty item"),
        (f"0-{MAX_TASKS}", f"more than {MAX_TASKS:,} tasks"),
        ("4000001", "is above 4,000,000"),
    ],
)
def test_a_bad_spec_is_refused_with_what_to_do(spec: str, fragment: str) -> None:
    with pytest.raises(InvalidValue) as caught:
        parse_array(spec)
    assert fragment in caught.value.message
    assert caught.value.field == "array"


def test_tasks_share_the_array_and_know_its_bounds() -> None:
    tasks = array_tasks("abc", (2, 4, 9))
    assert [(t.array_id, t.index, t.count, t.first, t.last) for t in tasks] == [
        ("abc", 2, 3, 2, 9),
        ("abc", 4, 3, 2, 9),
        ("abc", 9, 3, 2, 9),
    ]
    assert task_name("sweep", 4) == "sweep[4]"
