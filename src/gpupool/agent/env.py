"""The environment a replica's processes get.

Built from, in order (later wins):

1. a few basics of the node from the agent's environment (:data:`NODE_BASICS`: PATH, HOME,
   USER, LANG, LC_*, TMPDIR, LD_LIBRARY_PATH...), never the rest of it: nothing like the
   agent's ``CUDA_VISIBLE_DEVICES``, ``PYTHONPATH`` or ``VIRTUAL_ENV`` reaches a job;
2. the job's ``env`` from its spec, minus reserved names (the server already refuses them;
   the agent drops any that slip through). ``gpupool submit`` and ``run`` put the submitter's
   exported environment there (``--export``, ALL by default, like sbatch) and ``PWD``, the
   submit directory;
3. gpupool's variables, which the job can rely on:

| variable | value |
|---|---|
| ``CUDA_VISIBLE_DEVICES`` | the slice's device UUIDs, comma-separated (empty: no GPU) |
| ``GPUPOOL_JOB_ID``, ``GPUPOOL_JOB_NAME``, ``GPUPOOL_ASSIGNMENT_ID``, ``GPUPOOL_NODE`` | identity |
| ``GPUPOOL_RESTART_COUNT`` | 0 on the first run, +1 on each requeue |
| ``GPUPOOL_CHECKPOINT_DIR`` | a folder kept across restarts of the job |
| ``GPUPOOL_GPU_MILLI``, ``GPUPOOL_GPU_MEMORY_MIB`` | the slice per device |
| ``GPUPOOL_GPU_COUNT`` | number of devices |
| ``GPUPOOL_ISOLATION`` | the isolation mode enforced |
| ``GPUPOOL_CHECKPOINT_SIGNAL`` | the signal sent before a stop (``SIGTERM``) |
| ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` | gangs only |
| ``GPUPOOL_ARRAY_JOB_ID``, ``GPUPOOL_ARRAY_TASK_ID`` (index), ``GPUPOOL_ARRAY_TASK_COUNT``, |  |
| ``GPUPOOL_ARRAY_TASK_MIN``, ``GPUPOOL_ARRAY_TASK_MAX`` | array tasks (``sbatch --array``) |

4. the isolation mode's variables (MPS limits, soft caps, the shim's region); a ``PYTHONPATH``
   or ``LD_LIBRARY_PATH`` from it is put in front of the job's own (the shim's façade folder
   first, the job's entries kept after it).

Last, gpupool's own virtual environment (the one the agent runs from) is taken out: its
``bin`` leaves ``PATH`` and a ``VIRTUAL_ENV`` naming it is dropped, so ``python3`` in a job is
the user's, never gpupool's.

**Start folder** (:func:`start_folder`): the spec's ``workdir`` (it must exist on the node),
else the uploaded copy (``--workdir``, unpacked by the agent), else the submit directory
(``PWD`` in the job's env) when the node can see it (a standalone pool always can), else a
folder of the job's own, with a note saying why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gpupool.domain.environ import own_venv, without_venv
from gpupool.domain.jobs import reserved_env_rule
from gpupool.schemas.agent import AssignmentSpec

_KEEP_FROM_AGENT_EVEN_IF_RESERVED = ("LD_LIBRARY_PATH",)
#: Paths an isolation mode puts in front of the job's own (the shim's façade folder first on
#: ``LD_LIBRARY_PATH``, the soft start hook first on ``PYTHONPATH``), never instead of it.
_PREPENDED = ("PYTHONPATH", "LD_LIBRARY_PATH")

#: What a job takes from the node's (the agent's) environment; ``*`` marks a prefix.
NODE_BASICS = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "TERM",
    "LD_LIBRARY_PATH",
)


def _is_basic(name: str) -> bool:
    return any(
        name.startswith(rule[:-1]) if rule.endswith("*") else name == rule for rule in NODE_BASICS
    )


def start_folder(assignment: AssignmentSpec, own: Path) -> tuple[str, bool, str | None]:
    """Where the replica starts (see the module docstring), whether it is ``own`` (the agent
    makes it), and a note when the submit directory could not be used."""
    if assignment.workdir is not None:
        return assignment.workdir, False, None
    submit_dir = assignment.env.get("PWD")
    if submit_dir and os.path.isabs(submit_dir) and os.path.isdir(submit_dir):
        return submit_dir, False, None
    note = None
    if submit_dir and assignment.workdir_upload is None:
        note = (
            f"the submit directory {submit_dir} is not on this node: the job started in a "
            "folder of its own (upload the folder with --workdir DIR to run in a copy of it)"
        )
    return str(own), True, note


def job_env(
    assignment: AssignmentSpec,
    *,
    node: str,
    checkpoint_dir: str,
    isolation: str | None,
    isolation_env: Mapping[str, str],
    base_env: Mapping[str, str],
) -> tuple[dict[str, str], list[str]]:
    """The job's environment and the names dropped from its spec (reserved)."""
    venv = own_venv()
    env = {
        k: v
        for k, v in without_venv(dict(base_env), venv).items()
        if _is_basic(k) and (reserved_env_rule(k) is None or k in _KEEP_FROM_AGENT_EVEN_IF_RESERVED)
    }
    dropped = []
    for key, value in assignment.env.items():
        if reserved_env_rule(key) is not None:
            dropped.append(key)
            continue
        env[key] = value
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(assignment.device_uuids),
            "GPUPOOL_JOB_ID": assignment.job_id,
            "GPUPOOL_JOB_NAME": assignment.job_name,
            "GPUPOOL_ASSIGNMENT_ID": assignment.assignment_id,
            "GPUPOOL_NODE": node,
            "GPUPOOL_RESTART_COUNT": str(assignment.restart_count),
            "GPUPOOL_CHECKPOINT_DIR": checkpoint_dir,
            "GPUPOOL_GPU_MILLI": str(assignment.milli_per_device),
            "GPUPOOL_GPU_MEMORY_MIB": str(assignment.memory_mib_per_device),
            "GPUPOOL_GPU_COUNT": str(len(assignment.device_uuids)),
            "GPUPOOL_ISOLATION": isolation or "none",
            "GPUPOOL_CHECKPOINT_SIGNAL": assignment.checkpoint_signal,
        }
    )
    task = assignment.array
    if task is not None:
        env.update(
            {
                "GPUPOOL_ARRAY_JOB_ID": task.array_id,
                "GPUPOOL_ARRAY_TASK_ID": str(task.index),
                "GPUPOOL_ARRAY_TASK_COUNT": str(task.count),
                "GPUPOOL_ARRAY_TASK_MIN": str(task.first),
                "GPUPOOL_ARRAY_TASK_MAX": str(task.last),
            }
        )
    gang = assignment.gang
    if gang is not None:
        env.update(
            {
                "MASTER_ADDR": gang.master_addr,
                "MASTER_PORT": str(gang.master_port),
                "WORLD_SIZE": str(gang.world_size),
                "RANK": str(gang.rank),
                "LOCAL_RANK": str(gang.local_rank),
            }
        )
    for key, value in isolation_env.items():
        if key in _PREPENDED and env.get(key):
            env[key] = f"{value}:{env[key]}"
        else:
            env[key] = value
    return without_venv(env, venv), dropped
