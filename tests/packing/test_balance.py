"""The CPU balance and GPU-model pressure rules of ``fragaware``, on hand-made clusters."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.scheduling.placement.balance import ResourceRatio, stranded_gpu, stranding_growth
from gpupool.scheduling.placement.base import Shape
from gpupool.scheduling.placement.fgd import FGDPolicy
from gpupool.scheduling.placement.fragaware import FragAwareConfig, FragAwarePolicy
from gpupool.scheduling.placement.fragmentation import ShapeDistribution, shape_key
from gpupool.scheduling.placement.scarcity import ModelDemand
from tests.packing.builders import cluster, cpu_only, share, whole


def _ratio(cpu_per_gpu: int, mib_per_gpu: int = 0) -> ResourceRatio:
    """A ratio learned from many identical whole-GPU arrivals (the prior outweighed)."""
    ratio = ResourceRatio(half_life=None, prior_gpus=1e-9)
    pod = Shape(
        milli=1000, count=1, memory_mib=0, cpu_milli=cpu_per_gpu, host_memory_mib=mib_per_gpu
    )
    for _ in range(10):
        ratio.observe(pod)
    return ratio


def test_ratio_learns_cpu_and_memory_per_gpu_from_gpu_replicas_only() -> None:
    ratio = _ratio(4000, 20_000)
    ratio.observe(cpu_only(64_000))  # CPU-only replicas do not change what a GPU needs
    assert ratio.cpu_per_milli == pytest.approx(4.0)
    assert ratio.mem_per_milli == pytest.approx(20.0)


def test_ratio_starts_from_the_prior() -> None:
    ratio = ResourceRatio()
    assert ratio.cpu_per_milli == pytest.approx(11.0)
    assert ratio.mem_per_milli == pytest.approx(40.96)


def test_stranded_gpu_is_what_free_cpu_or_memory_cannot_serve() -> None:
    ratio = _ratio(10_000, 10_000)  # 10 CPU milli and 10 MiB per GPU milli
    free_gpu = np.array([2000.0, 2000.0, 2000.0, 0.0])
    cpu = np.array([40_000.0, 5_000.0, 40_000.0, 0.0])
    mem = np.array([40_000.0, 40_000.0, 10_000.0, 0.0])
    # Node 0 has CPU and memory for 4 GPUs; node 1 CPU for 0.5 GPU; node 2 memory for 1 GPU.
    assert stranded_gpu(free_gpu, cpu, mem, ratio).tolist() == pytest.approx([0, 1500, 1000, 0])
    assert stranded_gpu(free_gpu, cpu, None, ratio).tolist() == pytest.approx([0, 1500, 0, 0])


def test_stranding_grows_where_the_cpu_taken_was_needed_by_free_gpus() -> None:
    capacity = cluster([[1000, 1000], [1000, 1000]], cpu=[22_000, 100_000])
    growth = stranding_growth(capacity, cpu_only(11_000), _ratio(11_000), memory=False)
    assert growth.tolist() == pytest.approx([1000.0, 0.0])


def _learned(policy: FGDPolicy | FragAwarePolicy, pods: list[Shape], times: int) -> None:
    for _ in range(times):
        for pod in pods:
            policy.observe(pod)


def test_fragaware_sends_cpu_only_replicas_to_cpu_rich_nodes_where_fgd_does_not() -> None:
    # Node 0 has just the CPU its two GPUs need (11 cores each); node 1 has plenty. A 12-core
    # CPU-only replica makes no shape stop fitting on either, so FGD's scores tie and the
    # lowest row wins; on node 0 it would leave a GPU without CPU.
    gpu_pod = whole(1, cpu=11_000)
    capacity = cluster([[1000, 1000], [1000, 1000]], cpu=[24_000, 100_000])
    pod = cpu_only(12_000)
    dist = ShapeDistribution.from_weights({shape_key(gpu_pod): 0.9, shape_key(pod): 0.1}, 2)
    fgd = FGDPolicy(distribution=dist)
    fragaware = FragAwarePolicy(config=FragAwareConfig(prior_weight=0.001))
    _learned(fragaware, [gpu_pod] * 9 + [pod], 5)
    fgd_choice = fgd.place(capacity, pod, capacity.feasible_nodes(pod))
    ours = fragaware.place(capacity, pod, capacity.feasible_nodes(pod))
    assert fgd_choice is not None
    assert fgd_choice.node == 0
    assert ours is not None
    assert ours.node == 1


def test_fragaware_without_the_balance_rule_ties_like_fgd() -> None:
    gpu_pod = whole(1, cpu=11_000)
    capacity = cluster([[1000, 1000], [1000, 1000]], cpu=[24_000, 100_000])
    pod = cpu_only(12_000)
    policy = FragAwarePolicy(config=FragAwareConfig(prior_weight=0.001, cpu_weight=0.0))
    _learned(policy, [gpu_pod] * 9 + [pod], 5)
    choice = policy.place(capacity, pod, capacity.feasible_nodes(pod))
    assert choice is not None
    assert choice.node == 0


def test_pressure_is_the_constrained_share_of_the_free_capacity_each_model_would_get() -> None:
    # Models A (node 0) and B (node 1), two free GPUs each. Half the GPU milli that arrived
    # accepts only B: filling the 4 free GPUs at that mix wants 2 GPUs of B, all of its free ones.
    capacity = cluster([[1000, 1000], [1000, 1000]], models=[0, 1])
    demand = ModelDemand(half_life=None)
    assert demand.pressure(capacity).tolist() == [0.0, 0.0]
    only_b = Shape(milli=500, count=1, memory_mib=0, models=(False, True))
    for _ in range(4):
        demand.observe(only_b)
        demand.observe(share(500))
    demand.observe(cpu_only(8000))  # no GPU, no demand on any model
    assert demand.constrained
    assert demand.pressure(capacity).tolist() == pytest.approx([0.0, 1.0])
    assert demand.levels(capacity, 4).tolist() == [0, 4]
    # B half used: the same demand now wants more than B has left (still level 4).
    capacity.free_milli[1] = [500, 0]
    assert demand.pressure(capacity)[1] == pytest.approx(0.5 * 2500 / 500)
    assert demand.levels(capacity, 4).tolist() == [0, 4]


def test_a_replica_that_accepts_several_models_goes_to_the_least_wanted_one() -> None:
    # Models A (8 GPUs), B (1 GPU), C (1 GPU). One arrival in 25 accepts only B: too rare for
    # the fragmentation distribution, but 4 % of the demand on 10 free GPUs wants 40 % of B.
    # A replica that accepts B or C scores the same on both; the pressure rule sends it to C.
    names = ("A", "B", "C")
    capacity = cluster([[1000] * 8, [1000], [1000]], models=[0, 1, 2], model_names=names)
    only_b = Shape(milli=1000, count=1, memory_mib=0, models=(False, True, False))
    b_or_c = Shape(milli=1000, count=1, memory_mib=0, models=(False, True, True))
    arrivals = [whole(1)] * 24 + [only_b]
    ruled = FragAwarePolicy(config=FragAwareConfig(prior_weight=0.001))
    plain = FragAwarePolicy(config=FragAwareConfig(prior_weight=0.001, pressure_multi=False))
    for policy in (ruled, plain):
        _learned(policy, arrivals, 1)
    feasible = capacity.feasible_nodes(b_or_c)
    demand = ModelDemand()
    for pod in arrivals:
        demand.observe(pod)
    assert demand.levels(capacity, 4).tolist() == [0, 1, 0]
    choice = ruled.place(capacity, b_or_c, feasible)
    assert choice is not None
    assert choice.node == 2
    choice = plain.place(capacity, b_or_c, feasible)
    assert choice is not None
    assert choice.node == 1
