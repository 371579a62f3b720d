"""The environment a replica's processes get.

Built from, in order (later wins):

1. the agent's own environment minus every reserved name (so nothing like the agent's
   ``CUDA_VISIBLE_DEVICES`` leaks into a job);
2. the job's ``env`` from its spec, minus reserved names (the server already refuses them;
   the agent drops any that slip through);
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

4. the isolation mode's variables (MPS limits, soft caps); a ``PYTHONPATH`` from it is put in
   front of the job's own.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpupool.domain.jobs import reserved_env_rule
from gpupool.schemas.agent import AssignmentSpec

_KEEP_FROM_AGENT_EVEN_IF_RESERVED = ("LD_LIBRARY_PATH",)


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
    env = {
        k: v
        for k, v in base_env.items()
        if reserved_env_rule(k) is None or k in _KEEP_FROM_AGENT_EVEN_IF_RESERVED
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
        if key == "PYTHONPATH" and env.get("PYTHONPATH"):
            env[key] = f"{value}:{env['PYTHONPATH']}"
        else:
            env[key] = value
    return env, dropped
