"""The wire form of a job's container (:class:`gpupool.domain.containers.ContainerSpec`): in
start orders to agents (``AssignmentSpec.container``) and in job views."""

from __future__ import annotations

from pydantic import Field

from gpupool.domain.containers import ContainerSpec
from gpupool.schemas.base import WireModel


class ContainerWire(WireModel):
    """The image a job runs in; ``mounts`` as ``SRC:DST[:ro]``; ``engine`` ``None``: the
    pool's default engine (a start order carries the one to use when the pool has one)."""

    image: str = Field(min_length=1, max_length=512)
    mounts: list[str] = Field(default_factory=list, max_length=64)
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    engine: str | None = None


def container_wire(
    spec: ContainerSpec | None, *, default_engine: str | None = None
) -> ContainerWire | None:
    """The domain value on the wire (``None`` stays ``None``); ``default_engine`` for a job
    that names none (a start order carries the pool's)."""
    if spec is None:
        return None
    return ContainerWire(
        image=spec.image,
        mounts=[str(m) for m in spec.mounts],
        workdir=spec.workdir,
        env=dict(spec.env),
        engine=spec.engine or default_engine,
    )
