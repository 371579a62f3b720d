"""Finding the server and the token: flags, environment, the user's config file, a local pool.

Each of the two values (server URL, token) is looked up in this order, first found wins:

1. what the caller passed (``--server`` / ``--token``, ``Client(server=..., token=...)``);
2. ``$GPUPOOL_SERVER`` / ``$GPUPOOL_TOKEN``;
3. the **user config file** written by ``gpupool login``:
   ``$XDG_CONFIG_HOME/gpupool/config.toml`` (default ``~/.config/gpupool/config.toml``), mode
   0600, with two keys ``server = "..."`` and ``token = "..."``;
4. a **standalone pool** on this machine: the server URL in ``$GPUPOOL_HOME/server-url`` when that
   file exists, else ``http://127.0.0.1:8470`` (``gpupool up``'s default), and the admin token in
   ``$GPUPOOL_HOME/admin-token`` (written by the server at first start). So right after
   ``make run`` every command works with no set-up.

:class:`Resolved` remembers where each value came from (``source``), for ``gpupool precheck``
and error hints.
"""

from __future__ import annotations

import os
import re

from gpupool.client.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

DEFAULT_SERVER = "http://127.0.0.1:8470"
#: Where a standalone pool keeps its files without ``$GPUPOOL_HOME``.
DEFAULT_HOME_TEXT = "~/.local/share/gpupool"


def _clean(path: str) -> str:
    """``path`` with ``~`` expanded and written as ``str(Path(path))`` writes it."""
    path = os.path.expanduser(path)
    return os.path.normpath(path) if ".." not in path.split("/") else path.rstrip("/") or "/"


def _home_text(env: Mapping[str, str]) -> str:
    return _clean(env.get("GPUPOOL_HOME") or DEFAULT_HOME_TEXT)


def _config_text(env: Mapping[str, str]) -> str:
    base = _clean(env.get("XDG_CONFIG_HOME") or "~/.config")
    return os.path.join(base, "gpupool", "config.toml")


_LINE_RE = re.compile(r'^\s*(?P<key>[A-Za-z_]+)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*$')


def gpupool_home(env: Mapping[str, str] | None = None) -> Path:
    """``$GPUPOOL_HOME``, by default ``~/.local/share/gpupool`` (same rule as the server)."""
    from pathlib import Path  # the hot verbs never need one (12 ms)

    return Path(_home_text(os.environ if env is None else env))


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """The user config file: ``$XDG_CONFIG_HOME/gpupool/config.toml`` (``~/.config`` default)."""
    from pathlib import Path

    return Path(_config_text(os.environ if env is None else env))


def read_config(path: Path | str) -> dict[str, str]:
    """The ``key = "value"`` lines of the config file; ``{}`` when it does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror}; fix it or run gpupool login"
        ) from None
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE_RE.match(line)
        if match is None:
            raise ConfigError(
                f'{path}:{number}: expected key = "value"; fix the line or run gpupool login again'
            )
        out[match.group("key")] = match.group("value").replace('\\"', '"').replace("\\\\", "\\")
    return out


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(path: Path, server: str, token: str) -> None:
    """Write the config file readable by its owner only (created 0600, replaced atomically)."""
    if any(c in value for value in (server, token) for c in "\n\r"):
        raise ConfigError("the server URL and token must be one line each")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write("# written by gpupool login\n")
        handle.write(f"server = {_quote(server)}\ntoken = {_quote(token)}\n")
    os.replace(tmp, path)


class Resolved:
    """A server URL and token with where each came from (``flag``, ``env``, ``config``, ...).

    Immutable and compared by value; a plain class, not a dataclass, because every hot CLI
    verb builds one and importing :mod:`dataclasses` costs it more than its request."""

    __slots__ = ("server", "server_source", "token", "token_source")
    server: str
    token: str | None
    server_source: str
    token_source: str | None

    def __init__(
        self, server: str, token: str | None, server_source: str, token_source: str | None
    ) -> None:
        for name, value in zip(
            self.__slots__, (server, server_source, token, token_source), strict=True
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Resolved is immutable: cannot set {name}")

    def _fields(self) -> tuple[str, str | None, str, str | None]:
        return (self.server, self.token, self.server_source, self.token_source)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Resolved) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Resolved(server={self.server!r}, token={'***' if self.token else None}, "
            f"server_source={self.server_source!r}, token_source={self.token_source!r})"
        )


def _read_first_line(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return text.splitlines()[0].strip() if text else None


def resolve(
    server: str | None = None,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Resolved:
    """Find the server and token (see the module docstring for the order)."""
    env = os.environ if env is None else env
    cfg_file = _config_text(env)
    cfg = read_config(cfg_file)
    home = _home_text(env)
    server_url, admin_token = os.path.join(home, "server-url"), os.path.join(home, "admin-token")
    candidates_server = (
        (server, "flag"),
        (env.get("GPUPOOL_SERVER"), "env GPUPOOL_SERVER"),
        (cfg.get("server"), f"config {cfg_file}"),
        (_read_first_line(server_url), f"standalone {server_url}"),
        (DEFAULT_SERVER, "default"),
    )
    url, url_source = next((v, s) for v, s in candidates_server if v)
    candidates_token = (
        (token, "flag"),
        (env.get("GPUPOOL_TOKEN"), "env GPUPOOL_TOKEN"),
        (cfg.get("token"), f"config {cfg_file}"),
        (_read_first_line(admin_token), f"standalone {admin_token}"),
    )
    found = next(((v, s) for v, s in candidates_token if v), (None, None))
    if not re.match(r"^https?://", url):
        raise ConfigError(
            f"server {url!r} ({url_source}) is not a URL: use http://host:port, e.g. "
            f"{DEFAULT_SERVER}"
        )
    return Resolved(url.rstrip("/"), found[0], url_source, found[1])
