"""Which Unix account a job's processes run as (``gpupool agent --run-as MODE``, ``gpupool up
--run-as MODE``), and the file modes that keep the node's credentials out of the job's reach.

- ``auto`` (the default): started as root, each job runs as its submitter's Unix account
  where one exists (a person's account: a UID from 1000 up, outside the transient range), and
  otherwise as a transient account of its own for that replica (:mod:`gpupool.agent.dynuid`,
  as systemd's ``DynamicUser=``), so no job runs as root or as the agent's account, and two
  tenants' replicas never share one. Started by an ordinary user, ``auto`` is ``agent``: the
  pool is that user's own (it cannot switch accounts), and it says so at start.
- ``agent``: the agent's own account, as on a one-person pool. Such a job can read everything
  the agent can: its token, its state folder and, beside ``gpupool up``, the server's home
  with the admin token and the store. Only right for a pool with one user, and said so at
  start (as root it means jobs run as root).
- ``submitter``: the account named like the job's gpupool user (``alice`` runs as Unix
  ``alice``, as with Slurm, where accounts come from LDAP/SSSD on every node).
- any other word: that Unix account for every job (a service account the operator made for
  jobs, e.g. ``useradd --system --no-create-home --shell /usr/sbin/nologin gpupool-job``). It
  must exist and not be root, and it must not be the agent's own account. Its cost: every
  tenant's jobs share it, so they can read each other's environments, files and uploads and
  signal each other; the agent says so at start.

Switching accounts needs the agent to run as root. The job's supervisor stays root-owned (it
records the exit code and writes the logs, which the job cannot alter) and starts the program
with the account's uid, gid and groups, and ``HOME``, ``USER``, ``LOGNAME`` of that account.
The job's working folder and checkpoint folder are given to the account. A user without an
account on the node, or one whose account is uid 0, is a boot failure with the reason: jobs
never run as root.

**Credentials out of reach** (:func:`protect_state`, :func:`check_token_file`): when jobs run as
another account, the agent's state folder and the folders above the jobs' folders are ``0711``
(others may pass to their own job's folder, not list or read), the supervisors' records
(``jobs/``: launch specs with their environments, logs; ``done/``) are ``0700``, and the agent
refuses to start while its token file is readable by anyone but itself. The job environment
never holds ``GPUPOOL_*`` names from the agent's (see agent/env.py), so ``GPUPOOL_TOKEN`` does
not reach a job, and ``/proc/<agent pid>/environ`` is readable only by the agent's account.

Jobs of different users then cannot read each other's folders (the agent makes the folders it
creates ``0700``, owned by the job's account) and cannot signal each other's processes. Jobs
that share one service account can reach each other's files, process environments and
processes; use ``submitter`` to keep tenants apart too.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.dynuid import FIRST_UID, LAST_UID, NoFreeUid, UidLeases
from gpupool.domain.errors import GpupoolError

AUTO = "auto"
AGENT = "agent"
SUBMITTER = "submitter"
MODES = (AUTO, AGENT, SUBMITTER)
#: The lowest UID of a person's account (``UID_MIN`` of login.defs): below it are system
#: accounts (``daemon``, ``nobody`` is 65534, above the range), which a job must not borrow.
PERSON_UID_MIN = 1000
#: Folder modes when jobs run as another account (see the module docstring).
PASS_ONLY = 0o711
PRIVATE = 0o700


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
    transient: bool = False  # a leased UID of its replica (agent/dynuid.py)

    def env(self) -> dict[str, str]:
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def resolve_mode(mode: str) -> str:
    """``auto`` as this process can do it: itself (root) or ``agent`` (an ordinary user)."""
    if mode == AUTO and os.geteuid() != 0:
        return AGENT
    return mode


def person_account(user: str) -> Account | None:
    """The Unix account named like gpupool user ``user`` when it is a person's (see ``auto``
    in the module docstring), else ``None``."""
    try:
        entry = pwd.getpwnam(user) if user else None
    except KeyError:
        return None
    if entry is None or entry.pw_uid < PERSON_UID_MIN or FIRST_UID <= entry.pw_uid <= LAST_UID:
        return None
    if entry.pw_uid in (0, os.geteuid()) or entry.pw_uid >= 65534:  # root, the agent, nobody
        return None
    groups = tuple(sorted(set(os.getgrouplist(user, entry.pw_gid))))
    return Account(user, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/")


def transient_account(uid: int, home: str) -> Account:
    """The account of a leased UID: no name in passwd, its own group, no other group."""
    return Account(f"gpupool-{uid}", uid, uid, (), home, transient=True)


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


def switches_account(mode: str) -> bool:
    """True when jobs run as an account other than the agent's (``auto`` as root,
    ``submitter`` or a named one)."""
    return resolve_mode(mode) != AGENT


def service_account(mode: str) -> Account | None:
    """The one account every job runs as under ``--run-as ACCOUNT``; ``None`` for ``agent`` and
    ``submitter``. Raises :class:`GpupoolError` saying what to do for a bad account."""
    if mode in MODES:
        return None
    try:
        entry = pwd.getpwnam(mode)
    except KeyError:
        raise GpupoolError(
            f"--run-as {mode!r}: no Unix account of that name; choose one of auto, agent, "
            "submitter, "
            "or an account made for jobs (e.g. `useradd --system --no-create-home --shell "
            f"/usr/sbin/nologin {mode}`)"
        ) from None
    if entry.pw_uid == 0:
        raise GpupoolError(
            f"--run-as {mode!r} is the Unix superuser: jobs never run as root; name an "
            "unprivileged account"
        )
    if entry.pw_uid == os.geteuid():
        raise GpupoolError(
            f"--run-as {mode!r} is the agent's own account, which holds its token: name "
            "another account (or use --run-as agent on a one-person pool)"
        )
    groups = tuple(sorted(set(os.getgrouplist(mode, entry.pw_gid))))
    return Account(mode, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/")


def job_account(
    mode: str,
    user: str,
    node: str,
    *,
    key: str = "",
    leases: UidLeases | None = None,
    home: str = "/",
) -> Account | None:
    """The account replica ``key`` of gpupool user ``user`` runs as (``None``: the agent's
    own), or :class:`NoAccount`. This is the one place the decision is made: every launch path
    (a plain process, a container) runs the job with what it returns. ``leases`` and ``home``
    (the job's working folder) serve ``auto``'s transient accounts."""
    mode = resolve_mode(mode)
    if mode == AGENT:
        return None
    if mode == AUTO:
        person = person_account(user)
        if person is not None:
            return person
        if leases is None:
            raise NoAccount(f"node {node} cannot lease a transient account for this job")
        try:
            return transient_account(leases.allocate(key), home)
        except (NoFreeUid, OSError) as exc:
            raise NoAccount(f"node {node}: {exc}") from None
    if mode == SUBMITTER:
        return account_for(user, node)
    try:
        return service_account(mode)
    except GpupoolError as exc:  # the account went away after the agent started
        raise NoAccount(str(exc)) from None


def check_mode(mode: str, reachable: list[Path]) -> None:
    """Refuse to start an agent that could not do what ``mode`` promises.

    ``reachable``: folders the jobs must be able to enter (their working and checkpoint folders
    live below them); every folder above them must let others pass (``o+x``)."""
    if not mode:
        raise GpupoolError(
            "--run-as needs a value: choose one of auto, agent, submitter or an account"
        )
    mode = resolve_mode(mode)
    if mode == AGENT:
        return
    service_account(mode)
    if os.geteuid() != 0:
        raise GpupoolError(
            f"--run-as {mode} starts jobs as another Unix account, which needs the agent to "
            "run as root: start it as root, or use --run-as agent"
        )
    for folder in reachable:
        for part in [folder.resolve(), *folder.resolve().parents]:
            if part.exists() and not part.stat().st_mode & stat.S_IXOTH:
                raise GpupoolError(
                    f"jobs running as another account cannot reach {folder}: {part} does not "
                    f"let others pass; `chmod o+x {part}`, or choose a --state-dir / "
                    "--checkpoint-root (gpupool up: a --home, e.g. /var/lib/gpupool) below "
                    "folders that do; --run-as agent runs jobs as this account instead (a "
                    "one-person machine only: as root, jobs would run as root)"
                )


def check_token_file(mode: str, path: Path) -> None:
    """Refuse a token file a job could read: readable by group or others, or owned by the
    account jobs run as."""
    if not switches_account(mode):
        return
    info = path.stat()
    if info.st_mode & 0o077:
        raise GpupoolError(
            f"the token file {path} is readable by other accounts (mode "
            f"{stat.S_IMODE(info.st_mode):04o}) and jobs run as another account: "
            f"`chmod 600 {path}`"
        )
    account = service_account(mode)
    if account is not None and info.st_uid == account.uid:
        raise GpupoolError(
            f"the token file {path} belongs to {account.name}, the account jobs run as: "
            f"`chown root {path}`"
        )


def protect_state(
    mode: str, state_dir: Path, reachable: list[Path], *, below: Path | None = None
) -> None:
    """Set the modes of the agent's state folder when jobs run as another account: the folder
    and ``reachable`` (where job folders are made) pass-only, the supervisors' records
    private. ``below``: a folder above ``state_dir`` (``gpupool up``'s home); the folders
    between the two are made pass-only too."""
    if not switches_account(mode):
        return
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(PASS_ONLY)
    if below is not None:
        top = below.resolve()
        for part in state_dir.resolve().parents:
            if part == top or not part.is_relative_to(top):
                break
            part.chmod(PASS_ONLY)
    for name in ("jobs", "done"):
        (state_dir / name).mkdir(exist_ok=True)
        (state_dir / name).chmod(PRIVATE)
    inside = state_dir.resolve()
    for folder in reachable:
        if folder.resolve().is_relative_to(inside):  # an operator's own folder is left alone
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(PASS_ONLY)


def hand_over(folder: Path, account: Account) -> None:
    """Give ``folder`` (and what is in it) to ``account``, readable by it alone."""
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), account.uid, account.gid)
    os.chown(folder, account.uid, account.gid)
    folder.chmod(0o700)
