"""The control plane's machinery: what runs behind the services.

The scheduling loop (snapshot -> schedule -> apply -> order), leadership, the snapshot builder,
the decision applier, the assignment lifecycle, orders for nodes, job state moves, group commit
and the clock. Services call into it (a submit wakes the loop, a heartbeat ends assignments
through the lifecycle and collects orders). It reaches back into services in three named
places only: the loop drives two background duties (``NodeService.mark_silent_nodes_down``,
``UploadService.prune``), the lifecycle accrues usage through ``accounting.accrue``, and the
start orders read a pool's oversubscription choice (``oversubscription.oversubscription_of``).
"""
