"""The event heap, checkpoint arithmetic and the report's formulas, on hand-checked values."""

from __future__ import annotations

import pytest

from gpupool.sim.engine import Event, EventKind, EventQueue
from gpupool.sim.jobstate import last_checkpoint, saved_work
from gpupool.sim.metrics import jain
from gpupool.sim.recorder import max_min_shares


def test_events_of_one_instant_come_out_together_finishes_before_arrivals() -> None:
    queue = EventQueue()
    queue.push(5, Event(EventKind.ARRIVAL, "a"))
    queue.push(5, Event(EventKind.FINISH, "b"))
    queue.push(1, Event(EventKind.ARRIVAL, "c"))
    queue.push(5, Event(EventKind.ARRIVAL, "d"))
    assert queue.pop_batch() == (1, [Event(EventKind.ARRIVAL, "c")])
    assert queue.clock.now() == 1
    time, batch = queue.pop_batch()
    assert time == 5
    assert [e.subject for e in batch] == ["b", "a", "d"]
    assert queue.clock.now() == 5
    assert len(queue) == 0


def test_the_past_cannot_be_scheduled() -> None:
    queue = EventQueue()
    queue.push(10, Event(EventKind.TICK, "tick"))
    queue.pop_batch()
    with pytest.raises(ValueError, match="before the current time"):
        queue.push(9, Event(EventKind.TICK, "tick"))


def test_saved_work_counts_whole_checkpoint_intervals_even_with_rounding() -> None:
    assert saved_work(89.9, 30) == 60
    assert saved_work(90.0, 30) == 90
    start = 4093.989
    assert saved_work((start + 600) - start, 300) == pytest.approx(600)  # not 300
    assert saved_work(1000, None) == 0
    assert last_checkpoint(100, 129, 30) is None
    assert last_checkpoint(100, 130, 30) == 130


def test_max_min_shares_cap_small_demands_and_split_the_rest_by_weight() -> None:
    shares = max_min_shares(1000, {"a": 100, "b": 2000, "c": 2000}, {"a": 1, "b": 1, "c": 3})
    assert shares["a"] == pytest.approx(100)
    assert shares["b"] == pytest.approx(225)
    assert shares["c"] == pytest.approx(675)
    assert max_min_shares(1000, {"a": 0, "b": 10}, {}) == {"a": 0.0, "b": 10.0}


def test_jain_index_is_one_when_equal_and_one_over_n_for_one_winner() -> None:
    assert jain([0.5, 0.5, 0.5]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([]) is None
