"""gpupool: one shared pool over every GPU a team owns.

Layers (imports point inward only, checked by import-linter in ``make test``)::

    domain  <-  scheduling  <-  control  <-  { api, agent, sim, cli, web }

See ``docs/architecture.md`` for the map of the package.
"""

__version__ = "0.1.0"
