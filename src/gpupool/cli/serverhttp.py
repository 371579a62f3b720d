"""uvicorn's HTTP protocol (httptools): a response's writes sent as one, quiet heartbeats
answered in the protocol.

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

**Quiet heartbeats in the protocol.** A fleet's heartbeats are mostly quiet, answered from
memory (``api/shortway.py``), and what such a heartbeat still cost the server was mostly the
layers around that answer: uvicorn's request cycle and the asyncio task it starts per
request, then FastAPI's, Starlette's and gpupool's middleware, each an ``await`` deep
(docs/benchmarks.md, "A fleet of agents": the heartbeat's server CPU). So
:class:`CoalescingHttpTools` takes a ``POST /v1/agent/heartbeat`` (exactly that path, HTTP/1.1,
a declared length of at most ``MAX_QUIET_BODY``, no ``Expect: 100-continue``, no request of the
connection still being answered) without starting that cycle: it keeps the body as the
parser gives it and, when the request is whole, asks
:func:`~gpupool.api.shortway.quiet_heartbeat` for the answer (the same checks as the ASGI
short way: a cached agent token, the body parsed and validated, a quiet answer). It writes
that answer itself (uvicorn's status line and default headers, the same body the route would
send) and the connection goes on as after any response (keep-alive, the next pipelined
request). Anything else, or no quiet answer, goes the usual way: the protocol starts
uvicorn's cycle for the request then (its body already whole), marked so the ASGI short way
does not try again, and the app answers it with every check of the route. No admission
(``api/shedding.py``) is asked for a quiet answer: it takes no store connection and no
worker thread, and costs less than the ``503`` that shedding it would.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpupool.api.shortway import MAX_QUIET_BODY, PATH, TRIED, quiet_heartbeat

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


_HEARTBEAT = PATH.encode()


def _pool_state(app: Any) -> Any:
    """The pool app's ``app.state`` (with its ``services``) under the ASGI middleware uvicorn
    may have put around it (``proxy_headers``, trace logging), or ``None``: another app."""
    for _ in range(4):
        state = getattr(app, "state", None)
        if state is not None and hasattr(state, "services"):
            return state
        app = getattr(app, "app", None)
    return None


_OK = b"HTTP/1.1 200 OK\r\n"


class CoalescingHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol over a :class:`_Coalescing` transport, answering quiet
    heartbeats itself (see the module docstring)."""

    _quiet: bytearray | None = None  # the body of a heartbeat taken the short way, so far

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        real = cast(asyncio.Transport, transport)
        super().connection_made(cast(asyncio.Transport, _Coalescing(real, self.loop)))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._quiet = None

    def on_headers_complete(self) -> None:
        if self._takes_quietly():
            self._quiet = bytearray()
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._quiet is None:
            super().on_body(body)
        else:
            self._quiet += body

    def on_message_complete(self) -> None:
        if self._quiet is None:
            super().on_message_complete()
            return
        body, self._quiet = bytes(self._quiet), None
        answer = None
        if len(body) <= MAX_QUIET_BODY:
            answer = quiet_heartbeat(_pool_state(self.app), self.headers, body, self.client)
        if answer is None:  # the usual way, with the body already whole
            self.scope[TRIED] = True  # type: ignore[literal-required]
            super().on_headers_complete()
            self.cycle.body = bytearray(body)
            super().on_message_complete()
            return
        self._send_quiet(answer)

    def _takes_quietly(self) -> bool:
        """Whether this request may go the short way (see the module docstring)."""
        if self.url != _HEARTBEAT or self.expect_100_continue or self.pipeline:
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # an answer of this connection is still being written: keep order
        parser = self.parser
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
            return False
        if parser.should_upgrade() or _pool_state(self.app) is None:
            return False
        for name, value in self.headers:
            if name == b"content-length":
                text = value.strip()
                return text.isdigit() and int(text) <= MAX_QUIET_BODY
        return False  # chunked, or no body

    def _send_quiet(self, body: bytes) -> None:
        """Write a quiet answer as uvicorn writes a route's, then end the request."""
        keep_alive = self.parser.should_keep_alive()
        out = [_OK]
        for name, value in self.server_state.default_headers:
            out += [name, b": ", value, b"\r\n"]
        out += [b"content-length: ", b"%d" % len(body), b"\r\ncontent-type: application/json\r\n"]
        if not keep_alive:
            out.append(b"connection: close\r\n")
        out += [b"\r\n", body]
        self.transport.write(b"".join(out))
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()
