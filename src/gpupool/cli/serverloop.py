"""uvicorn's server for ``gpupool server`` and ``gpupool up``, asleep while the pool is idle.

uvicorn's own main loop wakes ten times a second (a previous pass made it once a second) to
do two things: refresh the ``Date`` header every response starts with, and see whether it was
asked to stop. An idle pool must not poll (issue 26: under 0.1 CPU-s a minute, where one
wake-up a second of an idle event loop costs about 0.01), so :class:`PoolServer` does both
without a tick:

- **the Date**: :class:`DatedState`, the state uvicorn shares with its connections, makes the
  header list when a connection reads it for a response (once per second at most, so the
  Date is as exact as uvicorn's and costs nothing while no response is written);
- **a stop**: :attr:`PoolServer.should_exit` is a property whose setter wakes the main loop
  at once, whoever sets it: the SIGTERM or SIGINT handler (``handle_exit``), or a caller in
  another thread. Its main loop then only waits on that.

uvicorn's tick is kept when something needs it: a request limit (``limit_max_requests``) or a
notify callback (``callback_notify``), neither of which ``gpupool`` sets. Imported by
:func:`gpupool.cli.server.serve` only (uvicorn is imported when the server starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from email.utils import formatdate
from types import FrameType

import uvicorn
from uvicorn.server import ServerState

Headers = list[tuple[bytes, bytes]]


class DatedState(ServerState):
    """uvicorn's state shared by its connections, whose ``default_headers`` (what every
    response starts with) carry a Date made when they are read, at most once a second.
    ``dated=False`` (``uvicorn.Config(date_header=False)``): no Date, as uvicorn does."""

    def __init__(self, *, dated: bool = True) -> None:
        self._dated = dated
        self._second = -1  # the whole second of the Date in ``_headers``; -1: none yet
        self._rest: Headers = []  # the headers uvicorn set, less any Date
        self._headers: Headers = []
        super().__init__()

    @property
    def default_headers(self) -> Headers:
        second = int(time.time())
        if second != self._second:
            date = [(b"date", formatdate(second, usegmt=True).encode())] if self._dated else []
            self._headers, self._second = date + self._rest, second
        return self._headers

    @default_headers.setter
    def default_headers(self, value: Headers) -> None:
        self._rest = [(name, v) for name, v in value if name.lower() != b"date"]
        self._second = -1


class PoolServer(uvicorn.Server):
    """See the module docstring. ``on_exit`` runs first when a signal asks the server to
    stop (``gpupool`` answers its agents' long polls then, instead of at their timeout)."""

    _exit = False
    _wake: Callable[[], object] | None = None

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.server_state = DatedState(dated=config.date_header)
        self._on_exit = on_exit

    @property
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit = value
        wake = self._wake
        if value and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: it has ended
                wake()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._on_exit is not None:
            self._on_exit()
        super().handle_exit(sig, frame)

    async def main_loop(self) -> None:
        """Sleep until a stop is asked (see the module docstring)."""
        if self.config.limit_max_requests is not None or self.config.callback_notify:
            await super().main_loop()
            return
        loop, stop = asyncio.get_running_loop(), asyncio.Event()
        self._wake = lambda: loop.call_soon_threadsafe(stop.set)
        await self.on_tick(0)  # uvicorn's first tick: the default headers
        while not self.should_exit:
            await stop.wait()
            stop.clear()
