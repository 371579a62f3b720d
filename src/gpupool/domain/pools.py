"""Pools: named sets of devices with their own policy.

``memory_overcommit`` is the ratio of GPU memory the pool may promise to the memory that
physically exists (1.0 = never promise more than exists; 1.5 = promise up to 150 %). When a
device of an overcommitted pool runs short, the agent checkpoints and requeues the
lowest-priority opportunistic job on it.

``memory_oversubscription`` says what a slice under isolation ``shim`` does with an allocation
that fits the slice but not the GPU's free memory: ``fail`` (the default: out of memory, with a
line naming the slice) or ``spill`` (served from host memory, counted and reported per job).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpupool.domain.containers import ENGINE_NAMES
from gpupool.domain.errors import InvalidValue

_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$")


def validate_name(kind: str, name: str) -> str:
    """Names of pools, tenants, users and priority classes: lowercase DNS labels."""
    if not _NAME_RE.match(name):
        raise InvalidValue(
            f"{kind} name {name!r} is not valid: use 1-64 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit",
            field=kind,
        )
    return name


DEFAULT_POOL = "default"
#: The values of ``Pool.memory_oversubscription``.
OVERSUBSCRIPTION_CHOICES = ("fail", "spill")


@dataclass(frozen=True)
class Pool:
    """A pool and its policy.

    ``placement`` names a policy in the scheduler's placement registry. ``price_per_gpu_hour``
    maps a GPU model to its cost of one whole device for one hour, in the pool's currency;
    models not listed cost ``default_price_per_gpu_hour``.
    """

    name: str
    placement: str = "default"
    memory_overcommit: float = 1.0
    price_per_gpu_hour: tuple[tuple[str, float], ...] = field(default=())
    default_price_per_gpu_hour: float = 0.0
    memory_oversubscription: str = "fail"
    #: Container jobs (submit --image): the engine a job that names none runs with (``None``:
    #: each node's first available), and the registries images may come from (empty: any).
    container_engine: str | None = None
    image_registries: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_name("pool", self.name)
        check_container_settings(self.name, self.container_engine, self.image_registries)
        if self.memory_oversubscription not in OVERSUBSCRIPTION_CHOICES:
            raise InvalidValue(
                f"pool {self.name}: memory_oversubscription {self.memory_oversubscription!r} is "
                f"not a choice: use {' or '.join(OVERSUBSCRIPTION_CHOICES)}",
                field="memory_oversubscription",
            )
        if not 1.0 <= self.memory_overcommit <= 4.0:
            raise InvalidValue(
                f"pool {self.name}: memory_overcommit {self.memory_overcommit} is out of range: "
                "use a ratio between 1.0 (no overcommit) and 4.0",
                field="memory_overcommit",
            )
        for model, price in self.price_per_gpu_hour:
            if price < 0:
                raise InvalidValue(
                    f"pool {self.name}: price for {model} is negative: use 0 or more",
                    field="price_per_gpu_hour",
                )

    def price_of(self, model: str) -> float:
        """Price of one whole device of ``model`` for one hour."""
        for name, price in self.price_per_gpu_hour:
            if name.lower() == model.lower():
                return price
        return self.default_price_per_gpu_hour


_REGISTRY_RE = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?$")


def check_container_settings(pool: str, engine: str | None, registries: tuple[str, ...]) -> None:
    """A pool's container settings, or InvalidValue saying what to write."""
    if engine is not None and engine not in ENGINE_NAMES:
        raise InvalidValue(
            f"pool {pool}: container engine {engine!r} is not known: use one of "
            f"{', '.join(ENGINE_NAMES)}",
            field="container_engine",
        )
    for r in registries:
        if not _REGISTRY_RE.match(r):
            raise InvalidValue(
                f"pool {pool}: image registry {r!r} is not a registry host: write e.g. "
                "nvcr.io, registry.example.com:5000, *.example.com or localhost",
                field="image_registries",
            )
