"""Which Unix account a job's processes run as (``gpupool agent --run-as MODE``).

- ``agent`` (the default): the agent's own account, as on a one-person pool (``gpupool up``).
- ``submitter``: the account named like the job's gpupool user (``alice`` runs as Unix
  ``alice``, as with Slurm, where accounts come from LDAP/SSSD on every node). The agent must
  run as root to switch; the job's supervisor stays root-owned (it records the exit code and
  writes the logs, which the job cannot alter) and starts the program with the account's uid,
  gid and groups, and ``HOME``, ``USER``, ``LOGNAME`` of that account. The job's working folder
  and checkpoint folder are given to the account. A user without an account on the node, or
  one whose account is uid 0, is a boot failure with the reason: jobs never run as root.

Jobs of different users then cannot read each other's folders (the agent makes the folders it
creates ``0700``, owned by the job's account) and cannot signal each other's processes.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from gpupool.domain.errors import GpupoolError

AGENT = "agent"
SUBMITTER = "submitter"
MODES = (AGENT, SUBMITTER)


class NoAccount(Exception):
    """The job cannot run as its submitter on this node; the message says why and what to do."""


@dataclass(frozen=True)
class Account:
    """A Unix account a job runs as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def env(self) -> dict[str, str]:
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def account_for(user: str, node: str) -> Account:
    """The Unix account of gpupool user ``user`` on this node, or :class:`NoAccount`."""
    if not user:
        raise NoAccount(
            "the assignment names no submitting user (a server older than this agent): "
            "upgrade the server, or run this node's agent with --run-as agent"
        )
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise NoAccount(
            f"no Unix account {user!r} on node {node}: create it (or make it known through "
            "LDAP/SSSD), or run this node's agent with --run-as agent"
        ) from None
    if entry.pw_uid == 0:
        raise NoAccount(
            f"gpupool user {user!r} is the Unix superuser on node {node}: jobs never run as "
            "root; submit as another user"
        )
    groups = tuple(sorted(set(os.getgrouplist(user, entry.pw_gid))))
    return Account(user, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/")


def check_mode(mode: str, reachable: list[Path]) -> None:
    """Refuse to start an agent that could not do what ``mode`` promises.

    ``reachable``: folders the jobs must be able to enter (their working and checkpoint folders
    live below them); every folder above them must let others pass (``o+x``)."""
    if mode not in MODES:
        raise GpupoolError(f"--run-as {mode!r}: choose one of {', '.join(MODES)}")
    if mode == AGENT:
        return
    if os.geteuid() != 0:
        raise GpupoolError(
            "--run-as submitter starts jobs as their users' Unix accounts, which needs the "
            "agent to run as root: start it as root, or use --run-as agent"
        )
    for folder in reachable:
        for part in [folder.resolve(), *folder.resolve().parents]:
            if part.exists() and not part.stat().st_mode & stat.S_IXOTH:
                raise GpupoolError(
                    f"jobs running as their submitters cannot reach {folder}: {part} does not "
                    f"let others pass; `chmod o+x {part}`, or choose a --state-dir / "
                    "--checkpoint-root below folders that do"
                )


def hand_over(folder: Path, account: Account) -> None:
    """Give ``folder`` (and what is in it) to ``account``, readable by it alone."""
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), account.uid, account.gid)
    os.chown(folder, account.uid, account.gid)
    folder.chmod(0o700)
