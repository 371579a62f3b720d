"""Where a job may run by name and by feature: ``--nodelist``, ``--exclude`` and
``--constraint`` (sbatch's ``-w``, ``-x`` and ``-C``), as one test per node.

A node's **features** are the words its agent declares (``gpupool agent --feature ib,a100x8``);
a job's **constraint** (:class:`gpupool.domain.interactive.Constraint`) is satisfied when one
of its ``&``-joined terms is a subset of them. A job whose constraint no node of its pool
satisfies waits with ``BadConstraints`` (Slurm's reason) naming the constraint and the features
the pool's nodes have, so the fix (another constraint, or ``--feature`` on an agent) is clear.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpupool.domain.jobs import JobSpec
from gpupool.domain.nodes import Node


def node_allowed(spec: JobSpec, node: str, features: Mapping[str, tuple[str, ...]]) -> bool:
    """True when ``spec`` may run on ``node`` (``features``: every node's, by name)."""
    if spec.nodelist and node not in spec.nodelist:
        return False
    if node in spec.exclude:
        return False
    return spec.constraint is None or spec.constraint.allows(features.get(node, ()))


def bad_constraint_message(spec: JobSpec, pool: str, nodes: Iterable[Node]) -> str:
    """Why a job with a constraint no node of ``pool`` satisfies waits, and what to do."""
    assert spec.constraint is not None
    have = sorted({f for n in nodes for f in n.features})
    listed = ", ".join(have) if have else "none (no agent declares any)"
    return (
        f"no node of pool {pool} has the features --constraint {spec.constraint.text!r} asks "
        f"for (features of the pool's nodes: {listed}): change the constraint, or start a "
        "node's agent with --feature"
    )
