"""The keys a job file takes: :data:`KNOWN_KEYS`, and :func:`check_keys`, which names every
unknown one with a "did you mean" (:func:`suggest`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpupool.domain.containers import KNOWN_KEYS as CONTAINER_KEYS
from gpupool.domain.specvalues import Collector

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


#: Key paths a job file may contain; ``*`` marks a mapping whose keys are free (env names).
KNOWN_KEYS: tuple[str, ...] = (
    "name",
    "command",
    "script",
    "env",
    "workdir",
    "tenant",
    "pool",
    "priority",
    "resources",
    "resources.gpus",
    "resources.gpu_memory",
    "resources.gpu_types",
    "resources.cpus",
    "resources.memory",
    "replicas",
    "preemptible",
    "requeue",
    "max_restarts",
    "time_limit",
    "expected_duration",
    "checkpoint",
    "checkpoint.signal",
    "checkpoint.grace",
    "isolation",
    # sbatch --dependency (gpupool.domain.dependency)
    "dependency",
    # sbatch --nodelist / --exclude
    "nodelist",
    "exclude",
    # sbatch --mail-type / --mail-user (gpupool.domain.mail)
    "mail_type",
    "mail_user",
    # issue 27's interactive part (gpupool.domain.interactive)
    "pty",
    "output",
    "error",
    "time_min",
    "constraint",
    "container",
    *CONTAINER_KEYS,
)
MAPPINGS = {"resources", "checkpoint", "env"}


def suggest(key: str) -> str:
    leaf = key.rsplit(".", 1)[-1]
    candidates = [k for k in KNOWN_KEYS if not k.endswith("*")]
    import difflib  # only for a key that is wrong (it costs every submit 7 ms)

    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    close = close or [k for k in candidates if k.rsplit(".", 1)[-1] == leaf]
    close = close or difflib.get_close_matches(
        leaf, [k.rsplit(".", 1)[-1] for k in candidates], n=1, cutoff=0.6
    )
    if close:
        match = close[0]
        full = next((k for k in candidates if k == match or k.endswith("." + match)), match)
        return f"did you mean {full!r}?"
    return "see examples/ for the keys a job file takes"


def check_keys(c: Collector, data: Mapping[str, Any], prefix: str) -> None:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if path.startswith("env."):
            continue
        if path not in KNOWN_KEYS:
            c.add(path, f"unknown key: {suggest(path)}")
            continue
        if path in MAPPINGS and isinstance(value, Mapping) and path != "env":
            check_keys(c, value, path + ".")
