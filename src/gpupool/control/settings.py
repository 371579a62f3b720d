"""Server settings, with their units. Built once at start (CLI options, environment).

- ``home``: the gpupool home folder (SQLite file, admin token, leader lock).
- ``database_url``: SQLAlchemy URL; ``None`` means SQLite under ``home``.
- ``heartbeat_interval_s``: how often agents heartbeat; ``node_timeout_s``: silence after which a
  node is marked down and its jobs are failed over.
- ``tick_s``: the scheduling loop's periodic wake-up (it also wakes on events).
- ``temperature_alert_c``: a device at or above this temperature raises an alert.
- ``schedule``: whether this server runs the scheduling loop (it still needs the leader lease).
- ``preempt_exempt_s``: the scheduler's anti-loop exemption: a running job is not preempted in
  its first ``preempt_exempt_s`` seconds.
- ``log_keep_bytes``: job log bytes kept per replica and stream under ``home/logs`` (the oldest
  are dropped beyond it).
- ``upload_max_bytes``: the largest working-directory archive ``POST /v1/uploads`` accepts.
- ``upload_retention_s``: uploads older than this that no unfinished job names are deleted
  (checked hourly by the scheduling leader).
- ``auth_cache_s``: how long a token's principal is kept in memory (seconds; 0 = not kept).
  Revocations made by this process take effect at once; made by another, within this time.
- ``catalog_cache_s``: how long submits trust the cached tenant, pool and priority-class
  names and values (seconds; 0 = read them each time). Changes made by this process take
  effect at once; made by another, within this time.
- ``metrics_token``: ``/metrics`` answers only a token of a role that reads the whole cluster
  (admin, operator); off: anyone who reaches the port may scrape it.
- ``metrics_tenants``: ``/metrics`` labels the queue with tenant names (off: per pool only, so
  an open ``/metrics`` names no tenant).
- ``submit_batch``: the most submits written in one transaction (group commit);
  ``submit_writers``: how many such transactions may be under way at once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.store.db import resolve_home, resolve_url


def _server_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ServerSettings:
    home: Path
    database_url: str
    host: str = "127.0.0.1"
    port: int = 8470
    heartbeat_interval_s: float = 5.0
    node_timeout_s: float = 30.0
    tick_s: float = 2.0
    temperature_alert_c: float = 85.0
    schedule: bool = True
    migrate: bool = False
    log_keep_bytes: int = 8 * 1024 * 1024
    upload_max_bytes: int = 100 * 1024 * 1024
    upload_retention_s: float = 7 * 24 * 3600.0
    preempt_exempt_s: float = 300.0
    auth_cache_s: float = 5.0
    catalog_cache_s: float = 5.0
    submit_batch: int = 64
    submit_writers: int = 2
    metrics_token: bool = False
    metrics_tenants: bool = False
    server_id: str = field(default_factory=_server_id)

    @property
    def admin_token_path(self) -> Path:
        return self.home / "admin-token"

    def to_json(self) -> str:
        """The settings as JSON, for server worker processes (see :meth:`from_json`)."""
        data = dataclasses.asdict(self)
        data["home"] = str(self.home)
        data.pop("server_id")
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> ServerSettings:
        data = json.loads(text)
        data["home"] = Path(data["home"])
        return cls(**data)

    @classmethod
    def build(
        cls,
        home: str | os.PathLike[str] | None = None,
        database_url: str | None = None,
        **options: object,
    ) -> ServerSettings:
        """Settings from explicit values, then the environment, then the defaults."""
        resolved = resolve_home(home)
        return cls(home=resolved, database_url=resolve_url(resolved, database_url), **options)  # type: ignore[arg-type]
