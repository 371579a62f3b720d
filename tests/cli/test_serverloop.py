"""The pool's uvicorn server sleeps while idle (``gpupool.cli.serverloop``, issue 26), against
a real uvicorn server on a socket: its loop no longer ticks, yet every response's Date is the
time it was written, not the start's or a stale tick's, and a stop asked from another thread
ends it at once. No timing assertion: the Date is compared with the clock around the call."""

from __future__ import annotations

import asyncio
import threading
import time
from email.utils import parsedate_to_datetime

import uvicorn

from gpupool.cli.serverloop import PoolServer
from tests.cli.test_serverhttp import _port, app


async def _date_of_get(port: int) -> tuple[float, float, float]:
    """(clock before, the answer's Date, clock after) of one GET."""
    before = time.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    head = (await reader.read()).partition(b"\r\n\r\n")[0].decode("latin-1")
    writer.close()
    after = time.time()
    dates = [line.split(":", 1)[1] for line in head.split("\r\n") if line.startswith("date:")]
    assert len(dates) == 1, head
    return before, parsedate_to_datetime(dates[0].strip()).timestamp(), after


def test_the_idle_servers_date_is_the_answers_and_a_stop_from_a_thread_ends_it() -> None:
    async def main() -> list[tuple[float, float, float]]:
        port = _port()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error")
        server = PoolServer(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        try:
            seen = [await _date_of_get(port)]
            await asyncio.sleep(2.5)  # idle: no tick refreshes anything meanwhile
            seen.append(await _date_of_get(port))
        finally:
            threading.Thread(target=setattr, args=(server, "should_exit", True)).start()
            await asyncio.wait_for(task, 60)  # ended: woken by the stop, not by a tick
        return seen

    for before, date, after in asyncio.run(main()):
        assert int(before) <= date <= after  # the Date is whole seconds
