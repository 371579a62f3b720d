"""Typed HTTP SDK used by the CLI, the agent and users' code.

- :class:`~gpupool.client.sdk.Client`: jobs, nodes, reports and admin calls over ``/v1``;
- :mod:`~gpupool.client.config`: where the server URL and token come from;
- :func:`~gpupool.client.notebook.allocate`: hold a slice from a notebook;
- :mod:`~gpupool.client.ipython`: the ``%gpupool`` magic.
"""

from __future__ import annotations

from gpupool.client.errors import ApiError, ClientError, ConfigError, ServerUnreachable
from gpupool.client.ipython import load_ipython_extension
from gpupool.client.notebook import Allocation, allocate
from gpupool.client.sdk import Client

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
