"""The assignment state table: every edge allowed, every other pair refused, and the stored
strings kept exactly (the store holds text, no migration)."""

from __future__ import annotations

import itertools

import pytest

from gpupool.domain.assignments import (
    ASSIGNMENT_TRANSITIONS,
    ENDS_THE_GANG,
    STOP_OUTCOME,
    AssignmentState,
    InvalidAssignmentMove,
    StopPolicy,
    StopReason,
    allowed_assignment_targets,
    check_move,
)
from gpupool.domain.jobs import JobSpec
from gpupool.domain.states import JobState

PAIRS = list(itertools.product(AssignmentState, AssignmentState))
EDGES = sorted(ASSIGNMENT_TRANSITIONS, key=lambda e: (e[0].value, e[1].value))
NON_EDGES = [p for p in PAIRS if p not in ASSIGNMENT_TRANSITIONS]


def test_the_states_and_reasons_are_the_strings_the_store_holds() -> None:
    assert [s.value for s in AssignmentState] == ["dispatched", "running", "finished"]
    assert {r.value for r in StopReason} == {
        "cancel",
        "preempt",
        "timeout",
        "gang",
        "memory",
        "pressure",
        "node",
        "boot",
    }
    assert AssignmentState.RUNNING == "running"
    assert str(StopReason.GANG) == "gang"


@pytest.mark.parametrize(("source", "target"), EDGES, ids=lambda s: s.value)
def test_every_edge_of_the_table_is_allowed_and_says_why(
    source: AssignmentState, target: AssignmentState
) -> None:
    check_move("a1", source, target)
    check_move("a1", source.value, target)  # as the row holds it
    assert target in allowed_assignment_targets(source)
    assert len(ASSIGNMENT_TRANSITIONS[(source, target)]) > 20


@pytest.mark.parametrize(("source", "target"), NON_EDGES, ids=lambda s: s.value)
def test_every_other_pair_is_refused_with_a_message_that_names_it(
    source: AssignmentState, target: AssignmentState
) -> None:
    with pytest.raises(InvalidAssignmentMove) as caught:
        check_move("a1", source.value, target)
    message = str(caught.value)
    assert f"assignment a1 cannot go from {source.value} to {target.value}" in message
    assert "report it" in message
    assert target not in allowed_assignment_targets(source)


def test_finished_is_final_and_an_unknown_stored_state_is_refused() -> None:
    assert allowed_assignment_targets(AssignmentState.FINISHED) == frozenset()
    with pytest.raises(InvalidAssignmentMove, match="from lost to finished"):
        check_move("a1", "lost", AssignmentState.FINISHED)


def test_every_state_but_dispatched_is_reached_from_dispatched() -> None:
    seen = {AssignmentState.DISPATCHED}
    frontier = [AssignmentState.DISPATCHED]
    while frontier:
        for nxt in allowed_assignment_targets(frontier.pop()):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(AssignmentState)


def test_stop_reasons_parse_from_their_strings_and_refuse_others() -> None:
    assert StopReason.parse("node") is StopReason.NODE
    assert StopReason.parse(StopReason.GANG) is StopReason.GANG
    with pytest.raises(ValueError, match="'lost' is not a stop reason: use one of cancel"):
        StopReason.parse("lost")


def test_outcomes_and_the_gang_rule_cover_the_reasons() -> None:
    assert set(STOP_OUTCOME) == set(StopReason) - {StopReason.GANG}
    assert STOP_OUTCOME[StopReason.NODE] is JobState.NODE_FAIL
    assert StopReason.CANCEL not in ENDS_THE_GANG
    assert StopReason.NODE in ENDS_THE_GANG


def test_the_stop_policy_is_read_from_the_spec() -> None:
    spec = JobSpec(name="j", command=("true",), checkpoint_signal="SIGUSR1", grace_period_s=7)
    assert StopPolicy.of(spec) == StopPolicy("SIGUSR1", 7.0)
