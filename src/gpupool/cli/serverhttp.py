"""uvicorn's HTTP protocol (httptools), with a response's writes sent as one.

uvicorn writes a response's status line and headers as soon as the app sends
``http.response.start``, then the body at ``http.response.body``: two ``send`` system calls
for every small answer, each of which, on loopback, runs the receiver's network stack too. For
a fleet's quiet heartbeats and long polls that second write was the largest single item left
in the server's profile (docs/benchmarks.md, "A fleet of agents": the heartbeat's server CPU).

:class:`CoalescingHttpTools` hands uvicorn's protocol a transport (:class:`_Coalescing`) that
keeps small writes until the end of the event loop's current turn (``call_soon``) and sends
them as one. Nothing waits longer than that turn; a write that would take the kept bytes over
``COALESCE_BYTES`` goes out at once with them (big bodies and streams are not held in memory);
``close`` and ``abort`` send or drop what is kept first, as the real transport would. Flow
control is unchanged: the real transport still tells uvicorn's protocol when to pause.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: The most bytes kept for the turn's single write.
COALESCE_BYTES = 64 * 1024


class _Coalescing:
    """A transport that sends the turn's small writes as one (see the module docstring)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._kept: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._size + len(data) > COALESCE_BYTES:
            self._kept.append(bytes(data))
            self.flush()
            return
        if not self._kept:
            self._loop.call_soon(self.flush)
        self._kept.append(bytes(data))
        self._size += len(data)

    def flush(self) -> None:
        if not self._kept:
            return
        data = self._kept[0] if len(self._kept) == 1 else b"".join(self._kept)
        self._kept.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._kept.clear()
        self._size = 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # the rest is the real transport's
        return getattr(self._transport, name)


class CoalescingHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol over a :class:`_Coalescing` transport."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        real = cast(asyncio.Transport, transport)
        super().connection_made(cast(asyncio.Transport, _Coalescing(real, self.loop)))
