"""A stand-in ``nvidia-cuda-mps-control`` for tests: a script on ``PATH`` that keeps its state
in the pipe folder (``CUDA_MPS_PIPE_DIRECTORY``), like the real one keeps its sockets there.

- ``-d`` "starts the daemon": creates ``control``;
- ``start_server -uid U`` starts a "server" for U: a sleeping process running as U (as the
  real server runs as its user), its pid kept in ``server.U``;
- ``get_server_list`` prints the pid of each server; ``get_client_list PID`` prints the pids
  in ``clients`` (one a line: the test decides which processes attached as clients);
- every command is appended to ``commands.log``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

SCRIPT = r"""#!{python}
import os, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
if sys.argv[1:] == ["-d"]:
    os.makedirs(pipe, exist_ok=True)
    open(os.path.join(pipe, "control"), "w").close()
    sys.exit(0)
if not os.path.exists(os.path.join(pipe, "control")):
    print("Cannot find MPS control daemon process"); sys.exit(1)
line = sys.stdin.readline().strip()
with open(os.path.join(pipe, "commands.log"), "a") as log:
    log.write(line + "\n")
words = line.split()
def servers():
    return {{f[7:]: open(os.path.join(pipe, f)).read().strip() for f in os.listdir(pipe)
             if f.startswith("server.")}}
if words[:1] == ["start_server"]:
    uid = int(words[words.index("-uid") + 1])
    path = os.path.join(pipe, "server." + str(uid))
    if not os.path.exists(path):
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.getuid() != uid:
                os.setgroups([]); os.setgid(uid); os.setuid(uid)
            os.write(ready_w, b"1")  # running as its user before anyone looks
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execvp("sleep", ["sleep", "600"])
        os.read(ready_r, 1)
        open(path, "w").write(str(pid))
elif words[:1] == ["get_server_list"]:
    for pid in servers().values():
        print(pid)
elif words[:1] == ["get_client_list"]:
    path = os.path.join(pipe, "clients")
    if os.path.exists(path):
        print(open(path).read().strip())
elif words[:1] == ["quit"]:
    os.remove(os.path.join(pipe, "control"))
    for pid in servers().values():
        try:
            os.kill(int(pid), 9)
        except OSError:
            pass
"""


def install(folder: Path, python: str) -> Path:
    """Write the fake control binary into ``folder`` (put it first on ``PATH``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nvidia-cuda-mps-control"
    path.write_text(SCRIPT.format(python=python))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def server_pid(pipe_dir: Path, uid: int) -> int:
    return int((pipe_dir / f"server.{uid}").read_text())


def kill_servers(pipe_dir: Path) -> None:
    for path in pipe_dir.glob("server.*"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(path.read_text()), 9)


def commands(pipe_dir: Path) -> list[str]:
    log = pipe_dir / "commands.log"
    return log.read_text().splitlines() if log.exists() else []
