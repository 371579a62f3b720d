"""A replica's terminal and ``-o``/``-e`` files in its launch record (issue 27).

``sbatch -o/-e`` patterns (:mod:`gpupool.domain.interactive`) are expanded here, on the node,
where the node's name is known: ``%j`` the job id, ``%x`` its name, ``%A``/``%a`` its array id
and index (the job id and ``4294967294`` outside an array, as Slurm), ``%u`` the submitting
user, ``%N`` this node. A relative path is taken from the job's start folder. The supervisor
opens the files as the job's account and writes every byte of the stream there, beside the
capped log the server keeps (``gpupool logs``); with ``-o`` alone, stderr goes to the same file.
"""

from __future__ import annotations

import os
from typing import Any

from gpupool.domain.interactive import expand_output
from gpupool.schemas.agent import AssignmentSpec

#: Slurm's ``%a`` outside an array (NO_VAL - 1).
NO_ARRAY_INDEX = "4294967294"


def output_files(a: AssignmentSpec, node: str, start_folder: str) -> dict[str, Any]:
    """The launch record's ``pty``, ``stdout_file`` and ``stderr_file`` for ``a``."""
    values = {
        "j": a.job_id,
        "x": a.job_name,
        "A": a.array.array_id if a.array is not None else a.job_id,
        "a": str(a.array.index) if a.array is not None else NO_ARRAY_INDEX,
        "u": a.user,
        "N": node,
    }

    def path(pattern: str | None) -> str | None:
        if pattern is None:
            return None
        return os.path.join(start_folder, expand_output(pattern, values))

    stdout = path(a.stdout_path)
    stderr = path(a.stderr_path) or stdout
    return {
        "pty": a.pty.model_dump() if a.pty is not None else None,
        "stdout_file": stdout,
        "stderr_file": stderr,
    }
