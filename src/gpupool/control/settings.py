"""Server settings, with their units. Built once at start (CLI options, environment).

- ``home``: the gpupool home folder (SQLite file, admin token, logs).
- ``database_url``: SQLAlchemy URL; ``None`` means SQLite under ``home``.
- ``heartbeat_interval_s``: how often agents heartbeat; ``node_timeout_s``: silence after which a
  node is marked down and its jobs are failed over.
- ``tick_s``: the scheduling loop's periodic wake-up (it also wakes on events).
- ``temperature_alert_c``: a device at or above this temperature raises an alert.
- ``schedule``: whether this server runs the scheduling loop (it still needs the leader lease).
- ``preempt_exempt_s``: the scheduler's anti-loop exemption: a running job is not preempted in
  its first ``preempt_exempt_s`` seconds.
- ``log_keep_bytes``: job log bytes kept per replica and stream under ``home/logs`` (the oldest
  are dropped beyond it, and readers are told how many). 64 MiB, the agent's default
  ``--log-cap``, so by default the server keeps all a node captured.
- ``upload_max_bytes``: the largest working-directory archive ``POST /v1/uploads`` accepts.
- ``upload_retention_s``: uploads older than this that no unfinished job names are deleted
  (checked hourly by the scheduling leader).
- ``auth_cache_s``: how long a token's principal is kept in memory (seconds; 0 = not kept).
  Revocations made by this process take effect at once; made by another, within this time.
- ``catalog_cache_s``: how long submits trust the cached tenant, pool and priority-class
  names and values (seconds; 0 = read them each time). Changes made by this process take
  effect at once; made by another, within this time.
- ``leader_lease_s``: how long the scheduling lease lasts without renewal (seconds; renewed every
  third of it): a frozen or cut-off leader is replaced by a standby within this time.
- ``metrics_token``: ``/metrics`` answers only a token of a role that reads the whole cluster
  (admin, operator); off: anyone who reaches the port may scrape it.
- ``metrics_tenants``: ``/metrics`` labels the queue with tenant names (off: per pool only, so
  an open ``/metrics`` names no tenant).
- ``trusted_proxies``: addresses or networks (CIDR) of reverse proxies whose
  ``X-Forwarded-For`` names the caller (see :mod:`gpupool.api.clientaddr`); empty (the
  default): the header is ignored and the connection's peer is the caller.
- ``submit_batch``: the most submits written in one transaction (group commit);
  ``submit_writers``: how many such transactions may be under way at once.
- ``smtp_host``, ``smtp_port``, ``smtp_from``, ``smtp_starttls``: where ``--mail-user ADDRESS``
  notices are sent (``None``: no SMTP host; such a submit is refused, naming ``--smtp-host``);
  ``mail_webhook``: the URL notices of jobs without ``--mail-user`` are POSTed to
  (:mod:`gpupool.control.notify`).

Every number is checked against its :class:`~gpupool.domain.bounds.Bound` (``SETTING_BOUNDS``)
when the settings are built, and the node timeout must exceed the heartbeat interval: a
``--heartbeat nan`` used to start a server whose node timeout never fired.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.domain.bounds import Bound
from gpupool.domain.errors import InvalidValue
from gpupool.domain.mail import check_mail_settings
from gpupool.store.db import resolve_home, resolve_url

_DAY = 86400.0
#: The accepted range of each numeric setting (field -> bound).
SETTING_BOUNDS: dict[str, Bound] = {
    "port": Bound("port", 0, 65535, "", "65535", "use a TCP port, like 8470"),
    "heartbeat_interval_s": Bound(
        "heartbeat interval", 0.01, 3600, "s", "1h", "use a few seconds, like 5"
    ),
    "node_timeout_s": Bound("node timeout", 0.02, 7 * _DAY, "s", "7 days", "use e.g. 30"),
    "tick_s": Bound("tick", 0.01, 3600, "s", "1h", "use a few seconds, like 2"),
    "temperature_alert_c": Bound("temperature alert", 0, 200, "C", "200C", "use e.g. 85"),
    "log_keep_bytes": Bound("log keep", 0, 2**40, "B", "1TiB", "use e.g. 8MiB"),
    "upload_max_bytes": Bound("upload max", 0, 2**40, "B", "1TiB", "use e.g. 100MiB"),
    "upload_retention_s": Bound("upload retention", 0, 3650 * _DAY, "s", "10 years", "e.g. 7d"),
    "preempt_exempt_s": Bound("preempt exempt", 0, 30 * _DAY, "s", "30 days", "use e.g. 300"),
    "auth_cache_s": Bound("auth cache", 0, _DAY, "s", "1 day", "use e.g. 5"),
    "catalog_cache_s": Bound("catalog cache", 0, _DAY, "s", "1 day", "use e.g. 5"),
    "submit_batch": Bound("submit batch", 1, 10_000, "", "10000", "use e.g. 64"),
    "submit_writers": Bound("submit writers", 1, 64, "", "64", "use e.g. 2"),
    "smtp_port": Bound("SMTP port", 1, 65535, "", "65535", "use 25, 587 or 465"),
}


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
    log_keep_bytes: int = 64 * 1024 * 1024
    upload_max_bytes: int = 100 * 1024 * 1024
    upload_retention_s: float = 7 * 24 * 3600.0
    preempt_exempt_s: float = 300.0
    auth_cache_s: float = 5.0
    catalog_cache_s: float = 5.0
    submit_batch: int = 64
    submit_writers: int = 2
    leader_lease_s: float = 15.0
    metrics_token: bool = False
    metrics_tenants: bool = False
    trusted_proxies: tuple[str, ...] = ()
    smtp_host: str | None = None
    smtp_port: int = 25
    smtp_from: str = "gpupool@localhost"
    smtp_starttls: bool = False
    mail_webhook: str | None = None
    server_id: str = field(default_factory=_server_id)

    def __post_init__(self) -> None:
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise InvalidValue(
                    f"trusted proxy {proxy!r} is not an address or a network: use e.g. "
                    "--trusted-proxies 10.0.0.5,10.1.0.0/16",
                    field="trusted_proxies",
                ) from None
        for name, bound in SETTING_BOUNDS.items():
            bound.check(float(getattr(self, name)))
        check_mail_settings(self.smtp_from, self.mail_webhook)
        if self.node_timeout_s <= self.heartbeat_interval_s:
            raise InvalidValue(
                f"node timeout ({self.node_timeout_s:g} s) must be longer than the heartbeat "
                f"interval ({self.heartbeat_interval_s:g} s): a node would be marked down "
                "between two heartbeats; use e.g. --node-timeout 30 --heartbeat 5",
                field="node_timeout_s",
            )

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
        data["trusted_proxies"] = tuple(data.get("trusted_proxies", ()))
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
