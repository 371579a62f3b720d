"""The web dashboard: pages and static assets served by the API server (no CDN, no build step).

:mod:`gpupool.web.routes` serves ``/`` (the page) and ``/ui/...`` (its assets from
``static/``). Everything else happens in the browser, in hand-written ES modules that call
the public API with the signed-in user's token:

- ``js/main.js``: sign-in, navigation by URL fragment (``#/jobs/ID``), the view registry;
- ``js/api.js``: fetch with the bearer token, problem+json errors, the server-sent event
  stream (read with fetch, since EventSource cannot send a token);
- ``js/live.js``: live updates (stream events, /metrics telemetry samples and their history);
- ``js/views/``: overview, jobs, job, nodes, teams, usage; each ``render(ctx, root, params)``
  draws into ``root`` and returns its cleanup.

Words: a **view** is one page of the dashboard; **telemetry** is the per-device sample read
from ``/metrics``; a **slice** segment is a share of one GPU drawn on its tile in the grid.
"""
