"""The registry of placement policies, by name.

Each policy module adds one entry to :data:`POLICIES`, explicitly (no import-time magic and no
``if name == ...`` chains). Pools name their policy; ``"default"`` resolves to
:data:`DEFAULT_POLICY`.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.domain.errors import InvalidValue
from gpupool.scheduling.placement.base import PlacementPolicy, PolicyOptions
from gpupool.scheduling.placement.bestfit import BestFit
from gpupool.scheduling.placement.dotprod import DotProdPolicy
from gpupool.scheduling.placement.fgd import FGDPolicy
from gpupool.scheduling.placement.fragaware import FragAwarePolicy
from gpupool.scheduling.placement.gpuclustering import GpuClusteringPolicy
from gpupool.scheduling.placement.gpupacking import GpuPackingPolicy
from gpupool.scheduling.placement.random_policy import RandomPolicy
from gpupool.scheduling.placement.spread import Spread

__all__ = ["DEFAULT_POLICY", "POLICIES", "PolicyOptions", "make_policy", "policy_names"]

PolicyFactory = Callable[[PolicyOptions], PlacementPolicy]

#: name -> factory. Policy modules register here; keep the list sorted by name.
POLICIES: dict[str, PolicyFactory] = {
    "bestfit": BestFit,
    "dotprod": DotProdPolicy,
    "fgd": FGDPolicy,
    "fragaware": FragAwarePolicy,
    "gpuclustering": GpuClusteringPolicy,
    "gpupacking": GpuPackingPolicy,
    "random": RandomPolicy,
    "spread": Spread,
}

#: What a pool's ``placement: default`` means: fragmentation-aware, CPU-balanced, learning the
#: workload online (measured against FGD in docs/benchmarks.md, Packing).
DEFAULT_POLICY = "fragaware"


def policy_names() -> tuple[str, ...]:
    """Every registered policy name (``default`` not included)."""
    return tuple(sorted(POLICIES))


def make_policy(name: str, options: PolicyOptions | None = None) -> PlacementPolicy:
    """Build the policy registered as ``name`` (``default`` means :data:`DEFAULT_POLICY`)."""
    resolved = DEFAULT_POLICY if name == "default" else name
    factory = POLICIES.get(resolved)
    if factory is None:
        names = ", ".join(("default", *policy_names()))
        raise InvalidValue(
            f"placement policy {name!r} is not known: use one of {names}", field="placement"
        )
    return factory(options or PolicyOptions())
