"""A pool's price key matches a device model as a GPU type does (issue 27: ``--price
A100-80GB=2.5`` and the help's own ``--price A100=2.5`` never matched ``NVIDIA A100-SXM4-80GB``)."""

from __future__ import annotations

from gpupool.domain.pools import Pool

A100_80 = "NVIDIA A100-SXM4-80GB"


def test_the_help_and_the_model_words_match_the_device_name() -> None:
    assert Pool("p", price_per_gpu_hour=(("A100", 2.0),)).price_of(A100_80) == 2.0
    assert Pool("p", price_per_gpu_hour=(("A100-80GB", 2.5),)).price_of(A100_80) == 2.5


def test_the_exact_name_then_the_most_specific_key_wins() -> None:
    prices = (("A100", 2.0), ("A100-80GB", 2.5), (A100_80.lower(), 3.0), ("A10", 0.7))
    pool = Pool("p", price_per_gpu_hour=prices, default_price_per_gpu_hour=1.0)
    assert pool.price_of(A100_80) == 3.0
    assert pool.price_of("NVIDIA A100-SXM4-40GB") == 2.0
    assert pool.price_of("NVIDIA A10") == 0.7
    assert pool.price_of("NVIDIA H100 80GB HBM3") == 1.0  # A10 is not a word of it: default
    more = Pool("p", price_per_gpu_hour=prices[:2])
    assert more.price_of(A100_80) == 2.5
