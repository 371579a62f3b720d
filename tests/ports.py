"""Free TCP ports for the servers the tests start, safe when pytest-xdist runs several workers.

The usual trick (bind port 0, read the port, close, let the server bind it) takes the port from
the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999 by default), the
same range every outgoing connection draws its local port from: once the probe socket is closed,
any client connect() on the machine (another worker's agent, an httpx client) may take that port
before the server binds it, and the server fails with "address already in use".

:func:`free_port` instead hands out ports below the ephemeral range, from a block of its own for
each xdist worker (``PYTEST_XDIST_WORKER`` = ``gw0``, ``gw1``, ...): no client ever gets one as
its local port and no two workers share a block (see :data:`BASE`). Within a process the
ports are handed out in turn from a random start in the block (so two suites run side by side,
both without xdist, do not walk the block in step), and each is checked by binding it: a port
still held by a process of an earlier test (or in TIME_WAIT) is passed over.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import socket
import threading

#: The blocks lie in 10000-19999: below the ephemeral range, and below the ports the server
#: gives gang jobs' rendezvous (``MASTER_PORT``, 20000-39999, control/machinery/apply_store.py),
#: which the e2e gang jobs bind on this same machine.
BASE = 10_000
END = 20_000
#: Ports per worker; 20 workers fit.
BLOCK = 500
_WORKERS = (END - BASE) // BLOCK

_lock = threading.Lock()
#: This process's next offset in its block, from a random start.
_turn = itertools.count(random.randrange(BLOCK))


def worker_index() -> int:
    """This process's xdist worker number (0 without xdist)."""
    m = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(m.group(1)) % _WORKERS if m else 0


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 nothing holds now, from this worker's block (see the module doc)."""
    first = BASE + worker_index() * BLOCK
    with _lock:
        for _ in range(BLOCK):
            port = first + next(_turn) % BLOCK
            if _bindable(port):
                return port
    raise RuntimeError(
        f"no free port in {first}-{first + BLOCK - 1}: processes of earlier tests still hold "
        "them (look for leftover gpupool servers: ps -ef | grep gpupool)"
    )
