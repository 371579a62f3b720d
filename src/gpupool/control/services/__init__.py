"""The control plane's services: what the API (and the CLI's break-glass paths) call.

One module per subject: jobs and their edits, arrays and the submit envelope, pools, tenants,
users, auth and audit, uploads, results and logs, accounting and telemetry, resize and
oversubscription, nodes and their heartbeats. A service validates, reads and writes the store in
one transaction, and answers; it never waits for the scheduling loop. The background parts it
relies on (the loop, leadership, the snapshot, orders, group commit, the clock) live in
:mod:`gpupool.control.machinery`.
"""
