"""Each packing policy on tiny hand-made clusters, where its choice can be worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.scheduling.placement.base import PolicyOptions, Shape
from gpupool.scheduling.placement.dotprod import DotProdPolicy
from gpupool.scheduling.placement.fgd import FGDPolicy, paper_score
from gpupool.scheduling.placement.fragaware import FragAwareConfig, FragAwarePolicy
from gpupool.scheduling.placement.fragmentation import ShapeDistribution, shape_key
from gpupool.scheduling.placement.gpuclustering import GpuClusteringPolicy
from gpupool.scheduling.placement.gpupacking import GpuPackingPolicy, gpupacking_scores
from gpupool.scheduling.placement.random_policy import RandomPolicy
from gpupool.scheduling.placement.registry import DEFAULT_POLICY, make_policy, policy_names
from tests.packing.builders import cluster, cpu_only, share, whole


def test_paper_score_matches_the_formula() -> None:
    assert paper_score(np.array([0.0, 500.0, -500.0, 1e6, -1e6])).tolist() == [50, 62, 37, 100, 0]


def test_fgd_takes_the_node_and_gpu_whose_fragmentation_drops_most() -> None:
    # Distribution: only 600-milli shares. Node 0 [1000, 1000] has F = 0; a 500 share on it
    # leaves 500 < 600, F = 500 (score 37). Node 1 [1000, 500] has F = 500; putting the share on
    # GPU 1 empties it, F = 0 (delta +500, score 62); on GPU 0, F = 1000 (score 37).
    dist = ShapeDistribution.from_weights({shape_key(share(600)): 1.0}, num_models=2)
    policy = FGDPolicy(distribution=dist)
    capacity = cluster([[1000, 1000], [1000, 500]])
    pod = share(500)
    choice = policy.place(capacity, pod, capacity.feasible_nodes(pod))
    assert choice is not None
    assert (choice.node, choice.slots) == (1, (1,))


def test_fgd_ties_go_to_the_lowest_row() -> None:
    dist = ShapeDistribution.from_weights({shape_key(whole(1)): 1.0}, num_models=2)
    policy = FGDPolicy(distribution=dist)
    capacity = cluster([[1000, 1000], [1000, 1000], [1000, 1000]])
    pod = whole(1)
    choice = policy.place(capacity, pod, capacity.feasible_nodes(pod))
    assert choice is not None
    assert choice.node == 0


def test_fgd_cache_sees_allocations_between_calls() -> None:
    dist = ShapeDistribution.from_weights({shape_key(share(600)): 1.0}, num_models=2)
    policy = FGDPolicy(distribution=dist)
    capacity = cluster([[1000, 1000], [1000, 500]])
    pod = share(500)
    first = policy.place(capacity, pod, capacity.feasible_nodes(pod))
    assert first is not None
    capacity.allocate(pod, first)  # node 1 becomes [1000, 0]
    second = policy.place(capacity, pod, capacity.feasible_nodes(pod))
    assert second is not None
    # Both nodes now score 37 for a share on a free GPU; the lowest row wins.
    assert second.node == 0


def test_dotprod_prefers_the_fuller_node() -> None:
    capacity = cluster([[1000] * 8, [1000, 1000, 0, 0, 0, 0, 0, 0]], cpu=[96_000, 32_000])
    pod = whole(1, cpu=4000)
    choice = DotProdPolicy().place(capacity, pod, capacity.feasible_nodes(pod))
    assert choice is not None
    assert choice.node == 1


def test_gpupacking_tiers() -> None:
    capacity = cluster([[1000, 1000], [1000, 500]])
    # A 300 share fits on node 1's used GPU (tier 1: 100 - 50/10 = 95); node 0 is free (tier 3).
    assert gpupacking_scores(capacity, share(300)).tolist() == [31, 95]
    # A whole GPU on node 1 takes a free GPU of a used node (tier 2: 50 - 1).
    assert gpupacking_scores(capacity, whole(1)).tolist() == [31, 49]
    assert gpupacking_scores(capacity, cpu_only(100)).tolist() == [0, 0]
    choice = GpuPackingPolicy().place(capacity, whole(1), capacity.feasible_nodes(whole(1)))
    assert choice is not None
    assert choice.node == 1


def test_gpuclustering_groups_kinds() -> None:
    capacity = cluster([[1000, 1000], [1000, 1000]])
    policy = GpuClusteringPolicy()
    pod = share(500)
    first = policy.place(capacity, pod, capacity.feasible_nodes(pod))
    assert first is not None
    assert first.node == 0
    capacity.allocate(pod, first)
    # Another share joins node 0 (band 75); a whole GPU avoids it (band 0 + 20 < 25 + 18).
    again = policy.place(capacity, pod, capacity.feasible_nodes(pod))
    assert again is not None
    assert again.node == 0
    capacity.allocate(pod, again)
    full = policy.place(capacity, whole(1), capacity.feasible_nodes(whole(1)))
    assert full is not None
    assert full.node == 1


def test_random_is_repeatable_and_stays_feasible() -> None:
    capacity = cluster([[1000, 200], [300, 300], [1000, 1000]])
    pod = share(500)
    feasible = capacity.feasible_nodes(pod)
    picks_a = [RandomPolicy(PolicyOptions(seed=7)).place(capacity, pod, feasible) for _ in range(3)]
    policy = RandomPolicy(PolicyOptions(seed=7))
    picks_b = [policy.place(capacity, pod, feasible) for _ in range(20)]
    assert picks_a[0] == picks_b[0]
    assert all(c is not None and feasible[c.node] for c in picks_b)
    assert {c.node for c in picks_b if c is not None} == {0, 2}


def _probabilities(policy: FragAwarePolicy) -> dict[object, float]:
    assert policy.distribution is not None
    return dict(policy.distribution.probabilities())


def test_fragaware_learns_only_what_it_observed_and_follows_a_mix_change() -> None:
    policy = FragAwarePolicy(
        config=FragAwareConfig(half_life=200.0, refresh_every=1, prior_weight=5.0)
    )
    capacity = cluster([[1000, 1000]])
    old, new = share(300), whole(1, cpu=2000)
    for _ in range(500):
        policy.observe(old)
    policy.place(capacity, old, capacity.feasible_nodes(old))
    before = _probabilities(policy)
    for _ in range(2000):
        policy.observe(new)
    policy.place(capacity, new, capacity.feasible_nodes(new))
    after = _probabilities(policy)
    assert before[shape_key(old)] > 0.9
    assert after.get(shape_key(new), 0.0) > 0.9
    assert after.get(shape_key(old), 0.0) < 0.05


def test_fragaware_places_before_observing_anything() -> None:
    capacity = cluster([[1000, 1000], [1000, 400]])
    pod = share(400)
    choice = FragAwarePolicy().place(capacity, pod, capacity.feasible_nodes(pod))
    assert choice is not None
    assert capacity.feasible_nodes(pod)[choice.node]


def test_the_default_placement_is_fragaware() -> None:
    assert DEFAULT_POLICY == "fragaware"
    assert make_policy("default").name == "fragaware"


def test_every_registered_packing_policy_is_built_by_name() -> None:
    for name in ("random", "dotprod", "gpuclustering", "gpupacking", "fgd", "fragaware"):
        assert name in policy_names()
        assert make_policy(name).name == name


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.sampled_from([0, 100, 250, 500, 700, 1000]), min_size=1, max_size=4),
        min_size=1,
        max_size=5,
    ),
    milli=st.sampled_from([100, 300, 500, 1000]),
    count=st.integers(min_value=0, max_value=3),
    name=st.sampled_from(["random", "dotprod", "gpuclustering", "gpupacking", "fgd", "fragaware"]),
)
def test_choice_always_fits_and_arrays_are_untouched(
    rows: list[list[int]], milli: int, count: int, name: str
) -> None:
    capacity = cluster(rows, cpu=[8000] * len(rows))
    pod = Shape(milli=milli if count <= 1 else 1000, count=count, memory_mib=0, cpu_milli=1000)
    feasible = capacity.feasible_nodes(pod)
    before = capacity.free_milli.copy()
    policy = make_policy(name)
    policy.observe(pod)
    choice = policy.place(capacity, pod, feasible)
    assert np.array_equal(capacity.free_milli, before)
    if not feasible.any():
        assert choice is None
        return
    assert choice is not None
    assert feasible[choice.node]
    capacity.allocate(pod, choice)  # raises if the slots cannot hold the shape


@pytest.mark.parametrize("name", ["fgd", "fragaware"])
def test_learning_policies_work_with_no_trace(name: str) -> None:
    capacity = cluster([[1000, 1000]])
    policy = make_policy(name)
    for pod in (share(500), whole(1), cpu_only(100)):
        policy.observe(pod)
        choice = policy.place(capacity, pod, capacity.feasible_nodes(pod))
        assert choice is not None
        capacity.allocate(pod, choice)


def test_fragaware_keeps_scarce_models_for_constrained_replicas() -> None:
    # Node 0 has model B, which constrained replicas need; node 1 has model A. An unconstrained
    # whole GPU scores the same on both (FGD would take row 0) but goes to model A.
    capacity = cluster([[1000, 1000], [1000, 1000]], models=[1, 0])
    policy = FragAwarePolicy(config=FragAwareConfig(prior_weight=0.001))
    only_b = Shape(milli=1000, count=1, memory_mib=0, models=(False, True))
    for _ in range(20):
        policy.observe(only_b)
        policy.observe(whole(1))
    pod = whole(1)
    choice = policy.place(capacity, pod, capacity.feasible_nodes(pod))
    assert choice is not None
    assert choice.node == 1
    constrained = policy.place(capacity, only_b, capacity.feasible_nodes(only_b))
    assert constrained is not None
    assert constrained.node == 0
