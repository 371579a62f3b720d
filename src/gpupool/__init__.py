"""gpupool: one shared pool over every GPU a team owns.

Layers (imports point inward only, checked by import-linter in ``make test``)::

    domain  <-  scheduling  <-  control  <-  { api, agent, sim, cli, web }

See ``docs/architecture.md`` for the map of the package.

``gpupool.Client``, ``gpupool.allocate`` and ``gpupool.load_ipython_extension`` (so that
``%load_ext gpupool`` works) are loaded on first use, so ``import gpupool.domain`` stays light.
Nor does this module import ``typing``: every job's supervisor imports the package in a fresh
interpreter (see :mod:`gpupool.agent.jobfiles`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # only mypy reads what this guards
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Client": "gpupool.client.sdk",
    "allocate": "gpupool.client.notebook",
    "load_ipython_extension": "gpupool.client.ipython",
    "unload_ipython_extension": "gpupool.client.ipython",
}

__all__ = ["Client", "__version__", "allocate", "load_ipython_extension"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpupool' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
