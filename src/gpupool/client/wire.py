"""The few HTTP calls of the hot verbs, on the standard library's sockets, answers as dicts.

:class:`gpupool.Client` is the SDK: httpx underneath, pydantic models out. Importing the two
costs about 0.2 CPU-s, ten times what ``sbatch`` spends on a whole submit, so ``gpupool submit``,
``queue``, ``cancel`` and ``show`` (:mod:`gpupool.cli.hotjobs`) speak HTTP/1.1 through
:class:`Wire` instead: one short connection per request (``Connection: close``; a server on
this machine or the LAN answers a hot verb in one or two requests), a JSON body, the JSON
answer as plain Python values. ``http.client`` is not used either: it imports the ``email``
package (about 30 ms) to parse headers.

What the SDK guarantees, :class:`Wire` keeps: the same discovery of server and token
(:func:`gpupool.client.config.resolve`), the same ``User-Agent`` and bearer token, the same
errors with the same words (:class:`~gpupool.client.errors.ApiError` from the problem+json
answer, :class:`~gpupool.client.errors.ServerUnreachable` naming the failure as httpx does:
``ConnectError``, ``ReadTimeout``), the same 15 s timeout, no redirects followed. An
``https://`` server is verified with the system's certificates (:mod:`ssl` imported then
only). A proxy set in the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, as httpx
honours them) sends the call through httpx instead: correct first, fast where it can be.
"""

from __future__ import annotations

import json
import os
import socket

from gpupool import __version__
from gpupool.client.config import Resolved, resolve
from gpupool.client.errors import ApiError, ConfigError, ServerUnreachable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

#: Seconds to wait for the server to connect and for each read (the SDK's default).
TIMEOUT_S = 15.0

_REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}


def _quote(text: str) -> str:
    """``text`` percent-encoded for a query or a path segment (unreserved characters kept)."""
    safe = "-_.~"
    out = []
    for ch in text:
        if ch.isascii() and (ch.isalnum() or ch in safe):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode())
    return "".join(out)


def query_string(params: Sequence[tuple[str, Any]]) -> str:
    """``[("state", "PENDING"), ("limit", 10)]`` as ``state=PENDING&limit=10``."""
    return "&".join(f"{_quote(k)}={_quote(str(v))}" for k, v in params)


def _proxied(scheme: str, host: str) -> bool:
    """Whether httpx would send a request to ``host`` through a proxy from the environment."""
    env = {k.lower(): v for k, v in os.environ.items() if k.lower().endswith("_proxy")}
    if not (env.get(f"{scheme}_proxy") or env.get("all_proxy")):
        return False
    for raw in (env.get("no_proxy") or "").split(","):
        entry = raw.strip().lstrip(".")
        if entry == "*" or (entry and (host == entry or host.endswith("." + entry))):
            return False
    return True


class Wire:
    """Requests to one server as plain data (see the module docstring)."""

    def __init__(self, server: str | None = None, token: str | None = None) -> None:
        self.resolved: Resolved = resolve(server, token)
        self.server = self.resolved.server
        scheme, _, rest = self.server.partition("://")
        hostport, _, base = rest.partition("/")
        self.tls = scheme == "https"
        self.base = "/" + base if base else ""
        host, colon, port = hostport.rpartition(":")
        if not colon or not port.isdigit() or "]" in port:
            host, port = hostport, "443" if self.tls else "80"
        self.host = host.strip("[]")
        self.hostport = hostport
        self.port = int(port)
        self.proxied = _proxied(scheme, self.host)

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, Any]] = (),
        body: Any = None,
    ) -> Any:
        """Send one request; the JSON answer, or :class:`ApiError` for an error answer."""
        token = self.resolved.token
        if not token and path.startswith("/v1/") and path != "/v1/version":
            raise ConfigError(
                f"no API token for {self.server}: pass --token, set GPUPOOL_TOKEN, or run "
                "gpupool login"
            )
        target = self.base + path + (f"?{query_string(query)}" if query else "")
        payload = b"" if body is None else json.dumps(body).encode()
        headers = {
            "Host": self.hostport,
            "User-Agent": f"gpupool-client/{__version__}",
            "Accept": "*/*",
            "Connection": "close",
        }
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        if body is not None or method in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(payload))
        if self.proxied:
            status, reason, data = self._through_httpx(method, target, headers, payload)
        else:
            status, reason, data = self._send(method, target, headers, payload)
        if status >= 400:
            raise _problem(status, reason, data)
        return json.loads(data) if data else None

    def _through_httpx(
        self, method: str, target: str, headers: dict[str, str], payload: bytes
    ) -> tuple[int, str, bytes]:
        import httpx  # only behind a proxy

        headers = {k: v for k, v in headers.items() if k not in ("Host", "Connection")}
        try:
            r = httpx.request(
                method,
                self.server.split("://")[0] + "://" + self.hostport + target,
                headers=headers,
                content=payload or None,
                timeout=TIMEOUT_S,
            )
        except httpx.TimeoutException:
            raise self._late() from None
        except httpx.TransportError as exc:
            raise self._unreachable(type(exc).__name__) from None
        return r.status_code, r.reason_phrase, r.content

    def _late(self) -> ServerUnreachable:
        return ServerUnreachable(
            f"{self.server} did not answer in time: check the server is up, or retry"
        )

    def _unreachable(self, kind: str) -> ServerUnreachable:
        return ServerUnreachable(
            f"cannot reach {self.server} ({kind}): start it with gpupool up, "
            "or pass --server / set GPUPOOL_SERVER"
        )

    def _connect(self) -> socket.socket:
        try:
            # an ASCII name as bytes: a str would load the idna codec first (1 ms)
            host: str | bytes = self.host.encode() if self.host.isascii() else self.host
            sock = socket.create_connection((host, self.port), timeout=TIMEOUT_S)  # type: ignore[arg-type]
        except TimeoutError:
            raise self._late() from None
        except OSError:
            raise self._unreachable("ConnectError") from None
        if not self.tls:
            return sock
        import ssl  # only for https

        try:
            return ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        except OSError:
            sock.close()
            raise self._unreachable("ConnectError") from None

    def _send(
        self, method: str, target: str, headers: dict[str, str], payload: bytes
    ) -> tuple[int, str, bytes]:
        head = f"{method} {target} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()
        )
        sock = self._connect()
        try:
            try:
                sock.sendall(head.encode("latin-1") + b"\r\n" + payload)
                return _read_response(sock)
            except TimeoutError:
                raise self._late() from None
            except (OSError, ValueError):
                raise self._unreachable("ReadError") from None
        finally:
            sock.close()


def _read_response(sock: socket.socket) -> tuple[int, str, bytes]:
    """Status, reason and body of the answer on ``sock`` (``Content-Length``, chunked, or to
    the end of the connection). Raises ``ValueError`` for an answer that is not HTTP/1.x."""
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("the server closed the connection before answering")
        buf += chunk
    end = buf.index(b"\r\n\r\n")
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    body = bytearray(buf[end + 4 :])
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    fields = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        fields[key.strip().lower()] = value.strip()
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        body += chunk
        expected = fields.get("content-length")
        if expected is not None and len(body) >= int(expected):
            break
    if fields.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(bytes(body))
    elif "content-length" in fields:
        length = int(fields["content-length"])
        if len(body) < length:
            raise ValueError("the answer ended early")
        body = body[:length]
    return int(code), reason, bytes(body)


def _dechunk(data: bytes) -> bytearray:
    out = bytearray()
    pos = 0
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol].split(b";")[0], 16)
        if size == 0:
            return out
        out += data[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


def _problem(status: int, reason: str, data: bytes) -> ApiError:
    """The error an error answer stands for, in the SDK's words (problem+json's title, detail)."""
    try:
        body = json.loads(data)
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    text = data.decode("utf-8", "replace").strip()[:300]
    detail = body.get("detail") or text or reason or _REASONS.get(status, "")
    return ApiError(status, str(body.get("title") or "error"), str(detail))
