"""A replica whose job names an image: its launch spec turned into a container's.

The agent's launch path (:mod:`gpupool.agent.launch`) prepares every replica the same way
(isolation, account, folders, upload) and builds the bare process's :class:`LaunchSpec`; for
a job with a container it then calls :meth:`ContainerRoom.launch_spec` once, which

1. writes the replica's slice as a CDI spec (:mod:`gpupool.containers.cdi`) into the node's
   CDI folder (``/var/run/cdi``, which podman 4.3 reads; it takes no spec folder option),
   named ``gpupool-<assignment>.json``: a replica-unique device ``gpupool.dev/slice=<id>``;
2. asks the job's engine (:data:`gpupool.containers.engines.ENGINES`) for its plan: pull when
   missing, create, start attached, remove; the CDI file's removal is one more cleanup step;
3. returns the launch spec the supervisor runs: the engine's argv as root, the job's account
   passed as ``--user`` (the supervisor keeps the logs, the exit code, the stop signal and
   the grace; the engine passes signals to the container's process).

Inside the container the job sees: its image's own ``PATH`` and files; its exported and own
environment (without the node's paths: ``PATH``, ``LD_LIBRARY_PATH``, ``HOME`` and the like
from the submitter's shell are left out, ``--container-env`` sets any name); gpupool's
variables; its working folder and checkpoint folder mounted at the same paths as on the node;
the user's ``--container-mounts``; and the slice (the CDI edits) and nothing more of the node.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from gpupool.agent.jobdir import LaunchSpec
from gpupool.agent.runas import Account
from gpupool.containers.cdi import (
    CDI_KIND,
    SliceInputs,
    cdi_json,
    driver_libraries,
    gpu_device_nodes,
    slice_edits,
)
from gpupool.containers.engines import (
    ENGINES,
    ContainerJob,
    EngineCheck,
    detect,
    write_containers_conf,
)
from gpupool.domain.containers import Mount, parse_mount
from gpupool.runtime.isolation import IsolationUnavailable
from gpupool.schemas.agent import AssignmentSpec

#: The folder of CDI specs podman and docker read (the one that does not survive a reboot).
CDI_DIR = Path("/var/run/cdi")
#: Names of the job's exported environment that describe the submitter's machine, not the
#: image: left out of the container unless ``--container-env`` sets them.
HOST_ONLY = frozenset(
    {"PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "PWD", "OLDPWD", "SHELL", "TMPDIR"}
)
#: Names the engine's own process reads: passed as ``NAME=VALUE`` on its command line, not
#: through its environment.
ENGINE_OWN = frozenset({"PATH", "CONTAINERS_CONF", "TMPDIR", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME"})


class JobInputRefused(IsolationUnavailable):
    """The job's own input cannot start on any node (a mount its account may not read): a
    boot failure that is not retried (``final``)."""


def container_name(key: str) -> str:
    return f"gpupool-{key}"


class ContainerRoom:
    """The node's container side: its engines (checked once), its ``containers.conf``, its
    CDI folder. One per agent."""

    def __init__(self, state_dir: Path, *, cdi_dir: Path = CDI_DIR) -> None:
        self.conf = write_containers_conf(state_dir)
        self.cdi_dir = cdi_dir
        self._checks: list[EngineCheck] | None = None

    def engine_env(self) -> dict[str, str]:
        """The environment engine commands run with."""
        return {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "CONTAINERS_CONF": str(self.conf),
        }

    def checks(self) -> list[EngineCheck]:
        if self._checks is None:
            self._checks = detect(self.engine_env())
        return self._checks

    def available(self) -> list[str]:
        return [c.name for c in self.checks() if c.available]

    def launch_spec(
        self,
        a: AssignmentSpec,
        spec: LaunchSpec,
        *,
        isolation_env: Mapping[str, str],
        device_minors: list[int],
        checkpoint_dir: str,
        account: Account | None,
    ) -> LaunchSpec:
        """The container's launch spec for the replica ``a`` whose bare one is ``spec``
        (see the module docstring); IsolationUnavailable when the node cannot run it."""
        c = a.container
        assert c is not None
        have = self.available()
        engine_name = c.engine or (have[0] if have else "podman")
        if engine_name not in have:
            why = next((x.missing for x in self.checks() if x.name == engine_name), None)
            raise IsolationUnavailable(
                f"the job runs in image {c.image} with engine {engine_name}, which node "
                f"{os.uname().nodename} cannot use ({why or 'unknown engine'}): see gpupool "
                "precheck and docs/deploy.md"
            )
        mounts = [Mount(spec.cwd, spec.cwd), Mount(checkpoint_dir, checkpoint_dir)]
        mounts += [parse_mount(m) for m in c.mounts]
        if account is not None:  # refused before anything is written for the replica
            _check_readable(mounts[2:], account)
        key = a.assignment_id
        cdi_path = self.cdi_dir / f"gpupool-{key}.json"
        edits = slice_edits(
            SliceInputs(
                device_nodes=gpu_device_nodes(device_minors, _dev_nvidia()),
                driver_libraries=_loader_libraries() if a.device_uuids else {},
                isolation_env=isolation_env,
                visible_devices=",".join(a.device_uuids),
            )
        )
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        tmp = cdi_path.with_suffix(".tmp")
        # Only root reads it (the engine): it names the replica's region, whose name is kept
        # from other accounts (runtime/shim.py).
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(cdi_json(key, edits))
        os.replace(tmp, cdi_path)
        slice_env = edits.env_map()
        inside = {k: v for k, v in spec.env.items() if k not in HOST_ONLY}
        inside.update(dict(c.env))
        for name in [*slice_env, *isolation_env]:  # the slice's, from the CDI edits only
            inside.pop(name, None)
        user = (account.uid, account.gid) if account is not None else (os.getuid(), os.getgid())
        groups = account.groups if account is not None else ()
        plan = ENGINES[engine_name].plan(
            ContainerJob(
                name=container_name(key),
                image=c.image,
                argv=tuple(spec.argv),
                env_names=tuple(sorted(k for k in inside if k not in ENGINE_OWN)),
                user=user,
                groups=tuple(groups),
                mounts=tuple(_dedupe(mounts)),
                workdir=c.workdir or spec.cwd,
                cdi_device=f"{CDI_KIND}={key}",
            )
        )
        create = plan.prepare[-1]
        at = create.index("--")
        create[at:at] = [
            a for k in sorted(inside) if k in ENGINE_OWN for a in ("--env", f"{k}={inside[k]}")
        ]
        engine_env = self.engine_env()
        env = {**{k: v for k, v in inside.items() if k not in ENGINE_OWN}, **engine_env}
        return replace(
            spec,
            argv=plan.argv,
            env=env,
            cwd="/",
            uid=None,
            gid=None,
            groups=[],
            prepare=plan.prepare,
            cleanup=[*plan.cleanup, ["rm", "-f", str(cdi_path)]],
            boot_failure=dict(plan.boot_failure),
        )


def _dedupe(mounts: list[Mount]) -> list[Mount]:
    seen: dict[str, Mount] = {}
    for m in mounts:
        seen.setdefault(m.target, m)
    return list(seen.values())


def _check_readable(mounts: list[Mount], account: Account) -> None:
    """Refuse a mount the job's account could not read on the node (the engine, as root,
    could): a user's mounts give the job nothing its account cannot already read."""
    for m in mounts:
        path = Path(m.source)
        try:
            st = path.stat()
        except OSError as exc:
            raise IsolationUnavailable(
                f"container mount {m}: {m.source} is not on this node ({exc.strerror})"
            ) from None
        mode = st.st_mode
        if st.st_uid == account.uid:
            ok = bool(mode & 0o400)
        elif st.st_gid in account.groups or st.st_gid == account.gid:
            ok = bool(mode & 0o040)
        else:
            ok = bool(mode & 0o004)
        if not ok:
            raise JobInputRefused(
                f"container mount {m}: account {account.name} may not read {m.source} on this "
                "node: mount a path it can read"
            )


def _dev_nvidia() -> frozenset[str]:
    with contextlib.suppress(OSError):
        return frozenset(str(p) for p in Path("/dev").glob("nvidia*"))
    return frozenset()


def _loader_libraries() -> dict[str, str]:
    """The driver libraries the dynamic loader's cache lists (``ldconfig -p``)."""
    try:
        out = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return driver_libraries(out)
