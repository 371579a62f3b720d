"""A lean HTTP/1.1 keep-alive client for the control-plane benchmarks.

The benchmark client shares the machine's cores with the server it measures, so it must cost
little: one asyncio stream per connection, requests written as prepared bytes, responses read
by ``Content-Length`` (the API never sends chunked bodies on these routes). Not a general HTTP
client: no redirects, no TLS, no chunked encoding.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any


class Connection:
    """One keep-alive connection to ``host:port``; ``request`` sends and reads one exchange."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        #: The last response's headers, lowercase names (e.g. ``retry-after``).
        self.headers: dict[str, str] = {}

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            sock = self._writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._reader, self._writer

    def head(self, method: str, path: str, body: bytes, extra: str = "") -> bytes:
        return (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self._fixed}{extra}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("ascii")

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """Send one request (``body`` as JSON when given); returns (status, response body)."""
        data = b"" if body is None else json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        return await self.send(self.head(method, path, data, extra) + data)

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        """Send prepared request bytes; returns (status, response body)."""
        reader, writer = await self._open()
        try:
            writer.write(raw)
            status_line = await reader.readuntil(b"\r\n")
            status = int(status_line.split(b" ", 2)[1])
            length, close = 0, False
            self.headers = {}
            while True:
                line = await reader.readuntil(b"\r\n")
                if line == b"\r\n":
                    break
                name, _, value = line.partition(b":")
                lname = name.strip().lower()
                self.headers[lname.decode("latin-1")] = value.strip().decode("latin-1")
                if lname == b"content-length":
                    length = int(value)
                elif lname == b"connection" and value.strip().lower() == b"close":
                    close = True
            payload = await reader.readexactly(length) if length else b""
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            raise
        if close:
            self.close()
        return status, payload

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
