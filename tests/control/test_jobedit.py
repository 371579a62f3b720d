"""Changing a pending job's spec (control/services/jobedit.py): what may change, the errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpupool.control.errors import Invalid
from gpupool.control.services.jobedit import updated_spec
from gpupool.domain.jobspec import build_spec

SPEC = build_spec(
    {
        "name": "train",
        "command": ["python", "train.py"],
        "resources": {"gpus": 0.5},
        "time_limit": "2h",
        "expected_duration": "1h",
    }
)


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"name": "train-2"}, "name", "train-2"),
        ({"priority": "low"}, "priority_class", "low"),
        ({"time_limit": "4h"}, "time_limit_s", 4 * 3600),
        ({"time_limit": 90}, "time_limit_s", 90 * 60),  # minutes, as sbatch -t
        ({"expected_duration": "30m"}, "expected_duration_s", 1800),
        ({"preemptible": True}, "preemptible", True),
    ],
)
def test_each_key_changes_only_its_field(
    changes: dict[str, object], field: str, value: object
) -> None:
    assert updated_spec(SPEC, changes) == replace(SPEC, **{field: value})


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({}, "nothing to change: give one of name, priority, time_limit"),
        ({"gpus": 2}, "gpus cannot be changed on a queued job"),
        ({"pool": "x", "command": ["y"]}, "command, pool cannot be changed"),
        ({"time_limit": "soon"}, "time_limit"),
        ({"time_limit": "-5"}, "time_limit"),
        ({"name": ""}, "name"),
        ({"preemptible": "perhaps"}, "preemptible"),
        ({"time_limit": "30m"}, "longer than time_limit"),  # the expected 1 h stays
        ({"expected_duration": "3h"}, "longer than time_limit"),
    ],
)
def test_a_bad_change_is_refused_with_what_to_do(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(Invalid) as caught:
        updated_spec(SPEC, changes)
    assert fragment in str(caught.value)


def test_both_limits_changed_together_are_checked_together() -> None:
    spec = updated_spec(SPEC, {"time_limit": "30m", "expected_duration": "20m"})
    assert (spec.time_limit_s, spec.expected_duration_s) == (1800, 1200)
