"""The server's HTTP protocol sends a response's writes as one (``gpupool.cli.serverhttp``),
against a real uvicorn server on a socket: every answer arrives whole and right, small and big,
and a small answer is written with one system call instead of uvicorn's two."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from gpupool.cli import serverhttp

BIG = b"x" * (3 * serverhttp.COALESCE_BYTES)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = BIG if scope["path"] == "/big" else b'{"ok":true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return data


def test_answers_arrive_whole_and_a_small_one_in_one_write() -> None:
    writes: list[int] = []
    real_flush = serverhttp._Coalescing.flush

    def counted(self: serverhttp._Coalescing) -> None:
        if self._kept:
            writes.append(self._size)
        real_flush(self)

    async def main() -> tuple[bytes, bytes, list[int]]:
        port = _port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, http=serverhttp.CoalescingHttpTools, log_level="error"
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        try:
            small = await _get(port, "/small")
            small_writes = list(writes)
            big = await _get(port, "/big")
        finally:
            server.should_exit = True
            await task
        return small, big, small_writes

    serverhttp._Coalescing.flush = counted  # type: ignore[method-assign]
    try:
        small, big, small_writes = asyncio.run(main())
    finally:
        serverhttp._Coalescing.flush = real_flush  # type: ignore[method-assign]
    head, _, body = small.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert body == b'{"ok":true}'
    assert len(small_writes) == 1  # status line, headers and body: one write
    assert small_writes[0] == len(small)
    head, _, body = big.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert body == BIG
