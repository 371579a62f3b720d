"""Every gpupool metric, defined in one place.

Names start with ``gpupool_``, use base units (``_bytes``, ``_seconds``, ``_ratio``) and never
carry a job id as a label (cardinality stays bounded by devices, pools and tenants).
Metrics read from the store at scrape time are produced by :mod:`gpupool.metrics.collector`;
the ones defined here are observed in-process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

#: gpupool's in-process metrics (the default registry's ``process_*`` metrics are not exported).
REGISTRY = CollectorRegistry()

SCHEDULER_CYCLE_SECONDS = Histogram(
    "gpupool_scheduler_cycle_seconds",
    "Wall time of one scheduling cycle (snapshot, schedule, commit)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)

NOTIFICATIONS = Counter(
    "gpupool_notifications",
    "Job notifications (--mail-type) by channel (email, webhook) and outcome: sent, retried "
    "(one failed try, another follows), failed (dropped after the last try or a full queue)",
    ["channel", "outcome"],
    registry=REGISTRY,
)
