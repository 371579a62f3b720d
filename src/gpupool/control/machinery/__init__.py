"""The control plane's machinery: what runs behind the services.

The scheduling loop (snapshot -> schedule -> apply -> order), leadership, the snapshot builder,
orders for nodes, job state moves, group commit and the clock. Services call into it (a submit
wakes the loop, a heartbeat collects orders); it never calls a service's API-facing entry points.
"""
