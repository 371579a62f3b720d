"""``--dependency`` and ``--begin`` parsing and the pure dependency rules (issue 27)."""

from __future__ import annotations

import pytest

from gpupool.domain.dependency import (
    Standing,
    Target,
    evaluate,
    parse_begin,
    parse_dependency,
)
from gpupool.domain.errors import InvalidValue
from gpupool.domain.states import JobState


def _t(state: JobState, started: bool = False) -> dict[str, list[Target]]:
    return {"a": [Target("a", state, started)]}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "is empty"),
        ("afterok", "needs job ids"),
        ("afterok:a,afterany:b?after:c", "mixes ','"),
        ("singleton:a", "takes no job id"),
        ("before:a", "is not a dependency kind"),
        ("afterok:a b", "needs job ids"),
    ],
)
def test_bad_dependencies_are_refused_with_a_hint(text: str, problem: str) -> None:
    with pytest.raises(InvalidValue, match=problem):
        parse_dependency(text)


def test_a_dependency_reads_back_as_it_was_written() -> None:
    for text in ("afterok:a:b,singleton", "afterany:a?afternotok:b", "aftercorr:x"):
        assert parse_dependency(text).text() == text


@pytest.mark.parametrize(
    ("kind", "state", "started", "standing"),
    [
        ("afterok", JobState.COMPLETED, True, Standing.MET),
        ("afterok", JobState.FAILED, True, Standing.NEVER),
        ("afterok", JobState.CANCELLED, False, Standing.NEVER),
        ("afterok", JobState.RUNNING, True, Standing.WAITING),
        ("afterany", JobState.CANCELLED, False, Standing.MET),
        ("afterany", JobState.PENDING, False, Standing.WAITING),
        ("afternotok", JobState.TIMEOUT, True, Standing.MET),
        ("afternotok", JobState.COMPLETED, True, Standing.NEVER),
        ("after", JobState.RUNNING, True, Standing.MET),
        ("after", JobState.PENDING, False, Standing.WAITING),
    ],
)
def test_each_kind_against_each_end(
    kind: str, state: JobState, started: bool, standing: Standing
) -> None:
    found = _t(state, started)
    assert evaluate(parse_dependency(f"{kind}:a"), lambda i: found.get(i, ())).standing is standing


def test_any_of_is_met_by_one_and_never_only_when_all_are_never() -> None:
    targets = {
        "a": [Target("a", JobState.FAILED, True)],
        "b": [Target("b", JobState.RUNNING, True)],
    }
    dep = parse_dependency("afterok:a?afterok:b")
    assert evaluate(dep, lambda i: targets[i]).standing is Standing.WAITING
    targets["b"] = [Target("b", JobState.COMPLETED, True)]
    assert evaluate(dep, lambda i: targets[i]).standing is Standing.MET
    targets["b"] = [Target("b", JobState.FAILED, True)]
    assert evaluate(dep, lambda i: targets[i]).standing is Standing.NEVER


def test_begin_forms() -> None:
    assert parse_begin("now", 1000.0) == 1000.0
    assert parse_begin("now+90", 1000.0) == 1090.0
    assert parse_begin("now+2hours", 1000.0) == 1000.0 + 7200
    assert parse_begin("now+1day", 1000.0) == 1000.0 + 86400
    assert parse_begin("1970-01-01", 5e9) == 5e9  # a past date: now
    with pytest.raises(InvalidValue, match="is not a unit"):
        parse_begin("now+3fortnights", 0.0)
    with pytest.raises(InvalidValue, match="is not a time"):
        parse_begin("soonish", 0.0)
