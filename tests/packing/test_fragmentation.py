"""The paper's fragmentation measure and shape distribution, checked by hand on tiny nodes."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.scheduling.placement.fragmentation import (
    ShapeDistribution,
    capacity_fragmentation,
    node_fragmentation,
    shape_key,
)
from tests.packing.builders import cluster, cpu_only, share, whole


def dist_of(weights: dict[object, float]) -> ShapeDistribution:
    return ShapeDistribution.from_weights(
        {shape_key(s): w for s, w in weights.items()},  # type: ignore[attr-defined]
        num_models=2,
        coverage=1.0,
    )


A = share(500, cpu=1000)
B = whole(1, cpu=800)
C = cpu_only(2000)


def test_fragment_counts_short_gpus_when_the_shape_fits() -> None:
    # GPUs [1000, 300]: A and B fit and see 300 as fragment; CPU-only C sees all 1300.
    dist = dist_of({A: 2.0, B: 1.0, C: 1.0})
    frag = capacity_fragmentation(cluster([[1000, 300]], cpu=[10_000]), dist)
    assert frag[0] == pytest.approx(0.5 * 300 + 0.25 * 300 + 0.25 * 1300)


def test_all_free_gpu_is_fragment_when_cpu_is_short() -> None:
    dist = dist_of({A: 2.0, B: 1.0, C: 1.0})
    frag = capacity_fragmentation(cluster([[1000, 300]], cpu=[500]), dist)
    assert frag[0] == pytest.approx(1300)


def test_model_not_allowed_makes_everything_fragment() -> None:
    only_b = share(500, cpu=0, models=(False, True))
    dist = dist_of({only_b: 1.0})
    capacity = cluster([[1000, 300], [1000, 300]], models=[0, 1])
    frag = capacity_fragmentation(capacity, dist)
    assert frag.tolist() == pytest.approx([1300, 300])


def test_multi_gpu_shape_needs_enough_gpus() -> None:
    dist = dist_of({whole(2): 1.0})
    frag = capacity_fragmentation(cluster([[1000, 1000, 400], [1000, 600, 400]]), dist)
    assert frag.tolist() == pytest.approx([400, 2000])


def test_distribution_keeps_top_shapes_up_to_coverage_and_renormalises() -> None:
    dist = ShapeDistribution.from_weights(
        {shape_key(A): 90.0, shape_key(B): 6.0, shape_key(C): 4.0}, num_models=2
    )
    assert dist.size == 2
    probs = dist.probabilities()
    assert probs[shape_key(A)] == pytest.approx(90 / 96)
    assert probs[shape_key(B)] == pytest.approx(6 / 96)
    assert shape_key(C) not in probs


def test_empty_distribution_measures_nothing() -> None:
    dist = ShapeDistribution.from_weights({}, num_models=2)
    assert capacity_fragmentation(cluster([[1000]]), dist).tolist() == [0.0]


def test_candidate_states_broadcast_like_single_rows() -> None:
    from gpupool.scheduling.placement.fragmentation import node_fragmentation

    dist = dist_of({A: 1.0, C: 1.0})
    free = np.array([[[1000, 300], [200, 1000]]], dtype=np.int64)  # [1, 2, 2]
    usable = np.ones_like(free, dtype=np.bool_)
    batch = node_fragmentation(free, usable, np.full((1, 2), 5000), np.zeros((1, 2), int), dist)
    single = [
        node_fragmentation(free[0, i], usable[0, i], np.array(5000), np.array(0), dist)
        for i in range(2)
    ]
    assert batch[0].tolist() == pytest.approx([float(s) for s in single])


def test_fragmentation_of_a_row_does_not_depend_on_the_rows_scored_with_it() -> None:
    rng = np.random.default_rng(5)
    n, g = 300, 8
    free = rng.choice([0, 190, 300, 530, 810, 1000], size=(n, g)).astype(np.int64)
    usable = rng.random((n, g)) < 0.9
    cpu = rng.integers(0, 96_000, size=n)
    model = rng.integers(0, 3, size=n)
    weights = {
        (int(c), int(m), 1, None): float(w)
        for c, m, w in zip(
            rng.integers(1, 32, size=60) * 1000,
            rng.integers(10, 1000, size=60),
            rng.random(60),
            strict=True,
        )
    }
    dist = ShapeDistribution.from_weights(weights, num_models=3, coverage=1.0)
    batch = node_fragmentation(free, usable, cpu, model, dist)
    alone = [
        float(node_fragmentation(free[i], usable[i], cpu[i], model[i], dist)) for i in range(n)
    ]
    assert batch.tolist() == alone  # bit for bit
