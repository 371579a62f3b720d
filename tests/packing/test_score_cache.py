"""FGD's score cache gives the same deltas and GPUs whether identical node states are shared."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.scheduling.placement import fgd
from gpupool.scheduling.placement.fgd import FragScoreCache
from gpupool.scheduling.placement.fragmentation import ShapeDistribution, shape_key
from tests.packing.builders import cluster, cpu_only, share, whole


@pytest.mark.parametrize("tight", [False, True])
def test_identical_rows_evaluated_once_score_like_every_row_alone(
    monkeypatch: pytest.MonkeyPatch, tight: bool
) -> None:
    rng = np.random.default_rng(3)
    # 100 nodes drawn from 5 states (so shared) plus 40 random ones, CPU from two levels.
    states = [[1000] * 4, [1000, 1000, 500, 0], [190, 1000, 1000, 300], [0, 0, 0, 1000]]
    rows = [states[int(i)] for i in rng.integers(len(states), size=100)]
    rows += [list(rng.choice([0, 190, 300, 500, 530, 1000], size=4)) for _ in range(40)]
    cpu = [int(c) for c in rng.choice([4000, 64_000], size=len(rows))]
    pods = [share(470, cpu=2000), share(810), whole(1, cpu=8000), whole(2), cpu_only(12_000)]
    weights = {shape_key(p): w for p, w in zip(pods, [3.0, 2.0, 4.0, 1.0, 1.0], strict=True)}
    dist = ShapeDistribution.from_weights(weights, num_models=2)
    for pod in pods:
        results = []
        for dedupe in (fgd.DEDUPE_ROWS, 10**9):
            monkeypatch.setattr(fgd, "DEDUPE_ROWS", dedupe)
            capacity = cluster(rows, cpu=cpu, models=[i % 2 for i in range(len(rows))])
            cache = FragScoreCache()
            cache.set_distribution(dist)
            cache.sync(capacity)
            delta, gpu = cache.best(capacity, pod, capacity.feasible_nodes(pod), tight=tight)
            results.append((delta.copy(), gpu.copy()))
        (shared_delta, shared_gpu), (alone_delta, alone_gpu) = results
        assert np.array_equal(shared_delta, alone_delta)
        assert np.array_equal(shared_gpu, alone_gpu)


def test_distinct_rows_agrees_with_numpy_unique_even_when_hashes_collide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np

    from gpupool.scheduling.placement import fgd

    rng = np.random.default_rng(7)
    state = rng.integers(0, 3, size=(500, 12)) * 250
    for weights in (fgd._ROW_WEIGHTS, np.zeros_like(fgd._ROW_WEIGHTS)):  # zeros: all collide
        monkeypatch.setattr(fgd, "_ROW_WEIGHTS", weights)
        first, inverse = fgd.distinct_rows(state)
        _, expected_first, _ = np.unique(state, axis=0, return_index=True, return_inverse=True)
        assert (state[first][inverse] == state).all()
        assert sorted(first.tolist()) == sorted(expected_first.tolist())
