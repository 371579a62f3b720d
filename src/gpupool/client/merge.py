"""Laying job-file mappings over each other: a job file, then the options given
(``gpupool submit -f job.yaml -g 2``, ``Client.submit(spec, gpus=2)``). Its own module, with no
imports, so that the CLI's hot path (:mod:`gpupool.cli.submitspec`) takes it without the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def merge_spec(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` laid over it, nested mappings merged key by key."""
    out: dict[str, Any] = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_spec(out[key], value)
        else:
            out[key] = value
    return out
