"""Receivers for notification tests: a small SMTP server and an HTTP webhook receiver, each on
a free local port in a thread of its own, keeping what they were sent.

:class:`SmtpSink` speaks the part of SMTP (RFC 5321) a client sending one message needs:
``EHLO``/``HELO``, ``MAIL FROM``, ``RCPT TO``, ``DATA`` (dot-unstuffed up to the lone ``.``),
``RSET``, ``NOOP``, ``QUIT``; anything else is answered 502. :class:`HookSink` answers the
first ``fail_first`` POSTs with 503 (to see the sender retry), then 200; with ``stall_first``
it first holds that many POSTs unanswered until ``release`` is set, then drops them (a
receiver that stalls while its sender is killed); ``delay_s`` waits before each 200.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class SmtpSink:
    """An SMTP server on 127.0.0.1; ``messages`` holds every message received (parsed)."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.recipients: list[list[str]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    def __enter__(self) -> SmtpSink:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the SMTP sink did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._session, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def say(line: str) -> None:
            writer.write(line.encode() + b"\r\n")
            await writer.drain()

        await say("220 sink ESMTP")
        rcpt: list[str] = []
        while line := await reader.readline():
            verb = line.decode(errors="replace").strip().split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                await say("250 sink")
            elif verb == "MAIL":
                rcpt = []
                await say("250 OK")
            elif verb == "RCPT":
                rcpt.append(line.decode().split(":", 1)[1].strip().strip("<>"))
                await say("250 OK")
            elif verb == "DATA":
                await say("354 end with <CRLF>.<CRLF>")
                body = bytearray()
                while (chunk := await reader.readline()) not in (b".\r\n", b".\n", b""):
                    body += chunk[1:] if chunk.startswith(b"..") else chunk
                self.messages.append(message_from_bytes(bytes(body)))
                self.recipients.append(rcpt)
                await say("250 queued")
            elif verb in ("RSET", "NOOP"):
                await say("250 OK")
            elif verb == "QUIT":
                await say("221 bye")
                break
            else:
                await say("502 not implemented")
        writer.close()


class HookSink:
    """An HTTP server on 127.0.0.1 keeping every JSON body POSTed to it (``bodies``, in order)."""

    def __init__(self, fail_first: int = 0, *, stall_first: int = 0, delay_s: float = 0.0):
        self.bodies: list[dict[str, Any]] = []
        self.refused = 0
        self.stalled: list[dict[str, Any]] = []  # held unanswered, then dropped
        self.held = threading.Event()  # a POST is being held
        self.release = threading.Event()
        sink = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    stall = len(sink.stalled) < stall_first
                    if stall:
                        sink.stalled.append(json.loads(body))
                if stall:
                    sink.held.set()
                    sink.release.wait(120)
                    return  # no answer: the connection closes
                if sink.refused < fail_first:
                    sink.refused += 1
                    self.send_response(503)
                else:
                    time.sleep(delay_s)
                    with lock:
                        sink.bodies.append(json.loads(body))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HookSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
