"""``gpupool run --pty`` (srun --pty): this side of the job's terminal.

Before the submit, :func:`listen` opens a TCP port on the address of this machine that reaches
the server (``GPUPOOL_PTY_ADDRESS`` overrides it, e.g. behind NAT) and makes a one-time key;
both go in the job's spec (``pty``). The job's supervisor on its node connects here when the
job starts and says the key first (the node side is :mod:`gpupool.agent.ptyrelay`, which also
describes the stream). :func:`session` waits for that connection (saying why the job pends,
as ``run`` does), then puts this terminal in raw mode and relays: keys typed go to the job's
terminal as they are (Ctrl-C included: the job's terminal makes it the job's SIGINT, the job
decides), the job's output comes back as it is, and each SIGWINCH sends the new window size.
When the node closes the stream the terminal is restored and ``run`` exits with the job's
exit status.

Why the node connects to ``run`` and not through the server: a terminal is a low-latency
byte stream for as long as the job lives, and the server's connections to agents are a long
poll and batched heartbeats built for orders, not keystrokes; Slurm's ``srun`` does the same
(``slurmstepd`` connects back to ``srun``'s port). The price: the node must reach the machine
``run`` runs on, as with srun.

Before the connection, Ctrl-C or SIGTERM cancels the job, as for ``run``; after, SIGTERM ends
the stream (the job's terminal is hung up: the job gets SIGHUP) and cancels the job.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import select
import signal
import socket
import struct
import sys
import termios
import tty
from collections.abc import Callable
from types import FrameType
from urllib.parse import urlsplit

from gpupool.client.logs import PendingNotice
from gpupool.client.sdk import Client
from gpupool.domain.states import JobState
from gpupool.schemas.jobs import JobView

HELLO = b"GPUPOOL-PTY "
FRAME = struct.Struct("!cI")
WINSIZE = struct.Struct("!HH")
POLL_S = 1.0


def _advertised_address(server_url: str) -> str:
    """This machine's address as the server's network sees it (the source address of a route
    to the server), or ``GPUPOOL_PTY_ADDRESS``."""
    given = os.environ.get("GPUPOOL_PTY_ADDRESS")
    if given:
        return given
    host = urlsplit(server_url).hostname or "127.0.0.1"
    port = urlsplit(server_url).port or 80
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as probe:
            probe.connect(family[4])
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def listen(server_url: str) -> tuple[socket.socket, dict[str, str]]:
    """A listening socket for the job's node and the spec's ``pty`` value for it."""
    host = _advertised_address(server_url)
    listener = socket.create_server((host, 0), family=_family(host), backlog=4)
    port = listener.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return listener, {"address": f"{shown}:{port}", "key": secrets.token_hex(16)}


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class _Terminated(Exception):
    """SIGTERM reached ``gpupool run --pty``."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def session(
    gp: Client,
    job: JobView,
    listener: socket.socket,
    key: str,
    exit_code: Callable[[JobView], int],
) -> int:
    """Wait for the job's node, relay the terminal until the job ends; the exit status."""
    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        conn = _wait_for_node(gp, job, listener, key)
        if isinstance(conn, int):
            return conn
        with conn:
            _relay(conn)
    except (KeyboardInterrupt, _Terminated) as exc:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        gp.cancel(job.id, reason=f"interrupted: {what} on gpupool run --pty")
        print(f"\ncancelled job {job.id}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 128 + signal.SIGTERM
    finally:
        listener.close()
        signal.signal(signal.SIGTERM, previous)
    return exit_code(gp.wait(job.id))


def _wait_for_node(
    gp: Client, job: JobView, listener: socket.socket, key: str
) -> socket.socket | int:
    """The node's connection, once it said ``key``; or the exit status when the job ended
    without connecting."""
    notice = PendingNotice()
    expected = HELLO + key.encode() + b"\n"
    while True:
        ready, _, _ = select.select([listener], [], [], POLL_S)
        if ready:
            conn, _ = listener.accept()
            conn.settimeout(10.0)
            try:
                hello = conn.recv(len(expected), socket.MSG_WAITALL)
            except OSError:
                hello = b""
            if hmac.compare_digest(hello, expected):
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return conn
            conn.close()  # not the job's node: keep waiting for it
            continue
        view = gp.get(job.id)
        notice(view)
        if JobState(view.state).is_terminal:
            print(
                f"job {view.id} ended {view.state} before its terminal connected"
                + (f" ({view.reason})" if view.reason else "")
                + f": see gpupool show {view.id}",
                file=sys.stderr,
            )
            return view.exit_code if view.exit_code not in (None, 0) else 1


def _window_size(fd: int) -> bytes | None:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return FRAME.pack(b"w", WINSIZE.size) + WINSIZE.pack(size.lines, size.columns)


def _relay(conn: socket.socket) -> None:
    """Bytes both ways until the node closes the stream; this terminal raw meanwhile."""
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    is_tty = os.isatty(stdin)
    saved = termios.tcgetattr(stdin) if is_tty else None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    old_wakeup = signal.set_wakeup_fd(wake_w)
    old_winch = signal.signal(signal.SIGWINCH, lambda *_: None)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if is_tty:
            tty.setraw(stdin)
            first = _window_size(stdin)
            if first is not None:
                conn.sendall(first)
        sources = [conn, stdin, wake_r]
        while True:
            ready, _, _ = select.select(sources, [], [])
            if conn in ready:
                data = conn.recv(65536)
                if not data:
                    return
                view = memoryview(data)
                while view:
                    view = view[os.write(stdout, view) :]
            if stdin in ready:
                typed = os.read(stdin, 65536)
                if not typed:
                    sources.remove(stdin)  # end of input (a pipe): the job sees no more
                else:
                    conn.sendall(FRAME.pack(b"d", len(typed)) + typed)
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                size = _window_size(stdin) if is_tty else None
                if size is not None:
                    conn.sendall(size)
    except OSError:
        return  # the node went away: the job's end decides the status
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old_winch)
        signal.set_wakeup_fd(old_wakeup)
        os.close(wake_r)
        os.close(wake_w)
