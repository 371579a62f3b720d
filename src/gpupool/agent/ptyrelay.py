"""The node's side of ``gpupool run --pty`` (srun --pty): a pseudo-terminal for the job's
program, its bytes relayed to and from the ``gpupool run`` that asked for it.

**The stream.** ``gpupool run --pty`` listens on a TCP port of its own machine and puts the
address and a one-time key in the job's spec (``pty``). When the job starts, its supervisor
connects there (before the program starts, so the first window size arrives first) and says
``GPUPOOL-PTY <key>\\n``. Then:

- node -> run: the terminal's output, raw bytes, until the program and everything it left on
  the terminal are gone (the master reads ``EIO``); then the node closes its side. The same
  bytes go to the job's stdout log (``gpupool logs``), capped as any log, and to its ``-o``
  file when it has one.
- run -> node: frames of one kind byte and a 4-byte big-endian length: ``d`` bytes typed (a
  Ctrl-C is byte 3: the terminal's line discipline makes it the job's SIGINT, so the job
  decides, as under srun), ``w`` a new window size (rows, columns as two 16-bit numbers), set
  with ``TIOCSWINSZ`` on the terminal, which sends SIGWINCH to the job's foreground group.

When the ``run`` side goes away (its connection ends) while the program runs, the terminal is
hung up: the job's group gets SIGHUP, as a shell whose terminal closed. When the node cannot
reach the ``run`` side at all (a firewall), the job still runs, with a note in its stderr log
and its input hung up the same way.

This module is imported by the supervisor only for a job with a terminal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import struct
import termios
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

HELLO = b"GPUPOOL-PTY "
FRAME = struct.Struct("!cI")
WINSIZE = struct.Struct("!HH")
DATA, RESIZE = b"d", b"w"
MAX_FRAME = 1 << 20
CONNECT_S = 30.0


def open_terminal(uid: int | None, gid: int | None) -> tuple[int, int]:
    """A new pseudo-terminal (master, slave), the slave owned by the job's account."""
    master, slave = os.openpty()
    set_size(master, 24, 80)
    if uid is not None:
        os.fchown(slave, uid, gid if gid is not None else -1)
        os.fchmod(slave, 0o620)
    return master, slave


def take_terminal() -> None:
    """In the job's child, after ``setsid``: make stdin (the slave) the controlling terminal,
    so that ^C, ^Z and window changes reach the job's foreground group. (The job's SIGINT is
    at its default: the supervisor catches it with a handler, never ``SIG_IGN``, which would
    outlive ``exec``.)"""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def connect(address: str, key: str, deadline_s: float = CONNECT_S) -> socket.socket | str:
    """The connection to ``gpupool run --pty`` at ``address`` after the hello, or why not."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    why = "no attempt"
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        try:
            sock = socket.create_connection((host, int(port)), timeout=5.0)
        except OSError as exc:
            why = exc.strerror or str(exc)
            time.sleep(0.5)
            continue
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(HELLO + key.encode() + b"\n")
        return sock
    return f"cannot reach gpupool run --pty at {address}: {why}"


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class Relay:
    """The bytes between the terminal's ``master`` and ``sock`` (``None``: none to relay),
    with the output also written through ``sinks`` (log and ``-o`` file writers)."""

    def __init__(
        self, master: int, sock: socket.socket | None, sinks: list[Callable[[bytes], None]]
    ) -> None:
        self.master = master
        self.sock = sock
        self.sinks = sinks
        self.pid: int | None = None
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self._output, daemon=True)]
        if sock is not None:
            self.threads.append(threading.Thread(target=self._input, daemon=True))

    def start(self, pid: int) -> None:
        """Relay for the job whose process group is ``pid``."""
        self.pid = pid
        for t in self.threads:
            t.start()
        if self.sock is None:
            self._hang_up()

    def join(self, timeout: float) -> None:
        self.threads[0].join(timeout)
        with contextlib.suppress(OSError):
            os.close(self.master)

    def _output(self) -> None:
        sock = self.sock
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: no process holds the terminal any more
                break
            if not chunk:
                break
            for sink in self.sinks:
                sink(chunk)
            if sock is not None:
                try:
                    sock.sendall(chunk)
                except OSError:
                    sock = None  # the run side is gone: keep draining into the log
        self.done.set()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()

    def _input(self) -> None:
        assert self.sock is not None
        try:
            while True:
                head = _recv_exact(self.sock, FRAME.size)
                if head is None:
                    break
                kind, size = FRAME.unpack(head)
                if size > MAX_FRAME:
                    break
                body = _recv_exact(self.sock, size) if size else b""
                if body is None:
                    break
                if kind == DATA:
                    view = memoryview(body)
                    while view:
                        view = view[os.write(self.master, view) :]
                elif kind == RESIZE and size == WINSIZE.size:
                    rows, cols = WINSIZE.unpack(body)
                    set_size(self.master, rows, cols)
        except OSError:
            pass
        if not self.done.is_set():
            self._hang_up()

    def _hang_up(self) -> None:
        """The terminal's other end is gone: SIGHUP to the job's group, as a closed tty."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGHUP)


class Terminal:
    """A job's terminal for the supervisor: the pseudo-terminal, the connection and the
    relay; :meth:`stdio` is how the program gets it, :meth:`close` ends the relay."""

    def __init__(self, master: int, slave: int, relay: Relay, log: Any) -> None:
        self.master, self.slave, self.relay, self.log = master, slave, relay, log

    @classmethod
    def open(cls, spec: dict[str, Any], log: Any, stderr_log: str) -> Terminal:
        """Open the terminal for launch record ``spec`` and connect to its ``pty`` endpoint;
        the output goes to ``log`` (a writer with ``write`` and ``close``), a connection that
        failed is said in ``stderr_log``."""
        master, slave = open_terminal(spec["uid"], spec["gid"])
        got = connect(spec["pty"]["address"], spec["pty"]["key"])
        sock = got if isinstance(got, socket.socket) else None
        if isinstance(got, str):
            with open(stderr_log, "ab") as f:
                f.write(f"[gpupool: {got}; the job runs without its terminal]\n".encode())
        return cls(master, slave, Relay(master, sock, [log.write]), log)

    def stdio(self) -> dict[str, Any]:
        """``Popen``'s arguments that give the program the terminal as its stdin, stdout,
        stderr and controlling terminal (the caller starts it in a session of its own)."""
        return {
            "stdin": self.slave,
            "stdout": self.slave,
            "stderr": self.slave,
            "preexec_fn": take_terminal,  # the relay's threads start after the fork
        }

    def started(self) -> None:
        """The program started (or failed to): the terminal's slave is its alone now."""
        os.close(self.slave)

    def close(self) -> None:
        self.relay.join(timeout=5.0)
        self.log.close()
