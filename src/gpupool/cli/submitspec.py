"""The job a ``submit`` (or ``run``) command line describes, validated: its options as
job-file keys (``-g 0.5`` is ``resources.gpus: 0.5``) over ``-f job.yaml``, the submitter's
environment as ``--export`` says, checked by :func:`gpupool.domain.jobspec.build_spec` over
:func:`~gpupool.domain.jobspec.nest_options`, the rules a job file and the server use, so a
bad value fails here with the option's name (:data:`gpupool.cli.out.OPTION_NAMES`).

On the hot path (:mod:`gpupool.cli.hot`): the standard library and :mod:`gpupool.domain` only.
A new submit option that sets a job-file key is one line in ``flat`` below (and its
declaration in :data:`gpupool.cli.options.SUBMIT`).
"""

from __future__ import annotations

import os

from gpupool.cli.out import fail
from gpupool.client.merge import merge_spec
from gpupool.domain.environ import own_venv_text, without_venv
from gpupool.domain.errors import InvalidValue
from gpupool.domain.jobs import reserved_env_rule, validate_env_name
from gpupool.domain.jobspec import build_spec, nest_options, parse_job_yaml

TYPE_CHECKING = False
if TYPE_CHECKING:  # pathlib costs a submit 12 ms: Path values come from options.parse only
    from collections.abc import Mapping
    from pathlib import Path
    from typing import Any


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise fail(f"-e {pair!r} is not KEY=VALUE: write it like -e WANDB_MODE=offline")
        env[key] = value
    return env


def export_env(
    export: str, environ: Mapping[str, str], venv: Path | str | None = None
) -> dict[str, str]:
    """The submitter's environment a job takes, from ``--export`` (as sbatch's): ``ALL``
    (everything but reserved names and gpupool's own virtual environment ``venv``), ``NONE``,
    or a comma list of ``NAME`` (from ``environ``) and ``NAME=value``, optionally after
    ``ALL`` or ``NONE``. A reserved or unset name given by name is refused."""
    items = export.split(",")
    out: dict[str, str] = {}
    mode = items[0].strip().upper()
    if mode in ("ALL", "NONE"):
        items.pop(0)
    if mode == "ALL":
        for name, value in environ.items():
            try:
                validate_env_name(name)
            except InvalidValue:
                continue  # reserved names, or ones no job file could hold: not exported
            out[name] = value
        out = without_venv(out, venv)
    for item in items:
        name, sep, value = item.strip().partition("=")
        if not name:
            raise fail(
                f"--export {export!r} has an empty name: give ALL, NONE or NAME[=value],... "
                "e.g. --export ALL,WANDB_MODE=offline"
            )
        try:
            validate_env_name(name)
        except InvalidValue as exc:
            if reserved_env_rule(name) is None:
                raise fail(f"--export {name}: {exc}") from None
            raise fail(
                f"--export {name}: environment name {name!r} is reserved "
                f"({reserved_env_rule(name)} is set by gpupool for the job): leave it out of "
                "--export"
            ) from None
        if not sep and name not in environ:
            raise fail(
                f"--export {name}: it is not set in your environment: set it, or give "
                f"--export {name}=VALUE"
            )
        out[name] = value if sep else environ[name]
    return out


def path_name(path: str) -> str:
    """``Path(path).name``: the last part of ``path``, ``""`` for ``/`` or ``.``."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return parts[-1] if parts else ""


def _joined(values: list[str] | None, sep: str) -> str | None:
    return sep.join(values) if values else None


def build_submission(params: Mapping[str, Any]) -> dict[str, Any]:
    """The job-file mapping for ``submit``'s options, ``params`` as
    :func:`gpupool.cli.options.parse` reads them (validated; raises SpecError).

    The job's env is the submitter's exported environment (``--export``, ALL by default),
    then the job file's, then ``-e``; ``PWD`` is the submit directory, where the job starts
    when its node can see it (see gpupool.agent.env)."""
    p = params.get
    argv: list[str] | None = p("argv")
    wrap: str | None = p("wrap")
    if argv and wrap is not None:
        raise fail("give either a command after -- or --wrap, not both")
    base: dict[str, Any] = {}
    file: Path | None = p("file")
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise fail(f"cannot read {file}: {exc.strerror}") from None
        parse_job_yaml(text, source=str(file))  # problems with file and line
        import yaml  # only for a job file

        base = yaml.safe_load(text) or {}
    requeue: bool | None = p("requeue")
    container_env: list[str] | None = p("container_env")
    flat: dict[str, Any] = {  # job-file key: its option's value (None: not given)
        "name": p("job_name"),
        "resources.gpus": p("gpus"),
        "resources.gpu_memory": p("gpu_mem"),
        "resources.gpu_types": _joined(p("gpu_type"), "|"),
        "resources.cpus": p("cpus"),
        "resources.memory": p("mem"),
        "pool": p("pool"),
        "tenant": p("account"),
        "priority": p("qos"),
        "time_limit": p("time_limit"),
        "expected_duration": p("expected"),
        "preemptible": p("preemptible"),
        "replicas": p("replicas"),
        "requeue": None if requeue is None else ("on-preemption" if requeue else "never"),
        "max_restarts": p("max_restarts"),
        "checkpoint.signal": p("checkpoint_signal"),
        "checkpoint.grace": p("grace"),
        "isolation": p("isolation"),
        "dependency": p("dependency"),
        "nodelist": p("nodelist"),
        "exclude": p("exclude"),
        "container.image": p("image"),  # --image and --container-*: like pyxis's options
        "container.mounts": _joined(p("container_mounts"), ","),
        "container.workdir": p("container_workdir"),
        "container.env": _env_pairs(container_env) if container_env else None,
        "container.engine": p("container_engine"),
        "output": p("output"),  # sbatch -o/--error, --time-min, --constraint
        "error": p("error"),
        "time_min": p("time_min"),
        "constraint": p("constraint"),
        "mail_type": p("mail_type"),  # sbatch --mail-type / --mail-user (gpupool.domain.mail)
        "mail_user": p("mail_user"),
    }
    workdir: Path | None = p("workdir")
    if workdir is not None and not workdir.is_dir():
        raise fail(f"--workdir {workdir} is not a folder: give an existing folder")
    overrides = nest_options(flat)
    export: str | None = p("export")
    exported = export_env("ALL" if export is None else export, os.environ, own_venv_text())
    exported["PWD"] = os.getcwd()
    base["env"] = {**exported, **(base.get("env") or {})}
    env: list[str] | None = p("env")
    if env:
        overrides["env"] = _env_pairs(env)
    if argv:
        overrides["command"] = list(argv)
        base.pop("script", None)
    elif wrap is not None:
        overrides["script"] = wrap
        base.pop("command", None)
    spec = merge_spec(base, overrides)
    if "name" not in spec:
        if argv:
            spec["name"] = path_name(argv[0]) or "job"
        elif wrap is not None:
            spec["name"] = "wrap"
    if "command" not in spec and "script" not in spec:
        raise fail(
            "nothing to run: give a command after --, e.g. gpupool submit -g 0.5 -- python "
            "train.py, or --wrap 'shell line', or -f job.yaml"
        )
    build_spec(spec)
    return spec
