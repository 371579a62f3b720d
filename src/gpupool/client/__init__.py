"""Typed HTTP SDK used by the CLI, the agent and users' code.

- :class:`~gpupool.client.sdk.Client`: jobs, nodes, reports and admin calls over ``/v1``;
- :mod:`~gpupool.client.config`: where the server URL and token come from;
- :func:`~gpupool.client.notebook.allocate`: hold a slice from a notebook;
- :mod:`~gpupool.client.ipython`: the ``%gpupool`` magic;
- :mod:`~gpupool.client.wire`: the CLI's hot verbs' few calls, without httpx or pydantic.

The SDK's names are loaded on first use (``from gpupool.client import Client`` works as ever).
"""

from __future__ import annotations

from gpupool.client.errors import ApiError, ClientError, ConfigError, ServerUnreachable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupool.client.ipython import load_ipython_extension
    from gpupool.client.notebook import Allocation, allocate
    from gpupool.client.sdk import Client

#: What is loaded on first use: the SDK imports httpx and pydantic, which the CLI's hot verbs
#: (:mod:`gpupool.client.wire`) do without, and they import this package.
_LAZY = {
    "Client": "gpupool.client.sdk",
    "Allocation": "gpupool.client.notebook",
    "allocate": "gpupool.client.notebook",
    "load_ipython_extension": "gpupool.client.ipython",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpupool.client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "Allocation",
    "ApiError",
    "Client",
    "ClientError",
    "ConfigError",
    "ServerUnreachable",
    "allocate",
    "load_ipython_extension",
]
