"""Building a :class:`~gpupool.domain.jobs.JobSpec` from what people write.

Two inputs, one validation:

- a YAML **job file** (:func:`parse_job_yaml`), whose problems name the file and line;
- **options** from the CLI or an API request (:func:`build_spec` on a mapping), whose problems
  name the option.

Every problem is collected (not just the first) and raised together as
:class:`~gpupool.domain.errors.SpecError`. Unknown keys are errors with a "did you mean"
(:mod:`gpupool.domain.speckeys`); each value is read by a parser of
:mod:`gpupool.domain.specvalues`, and this module puts them together into a spec, checking
what depends on several keys (``command`` or ``script``, ``expected_duration`` within
``time_limit``, ``exclusive`` with whole GPUs, ...).

The job file format (every key but ``name`` and ``command``/``script`` is optional)::

    name: train-resnet
    command: [python, train.py, --epochs, "10"]   # or  script: "python train.py | tee log"
    tenant: vision
    pool: default
    priority: normal
    resources:
      gpus: 0.5            # 0.5, 50%, 500m, or whole GPUs: 2
      gpu_memory: 10GiB    # per device
      gpu_types: [A100, H100]
      cpus: 4
      memory: 32GiB        # host memory
    replicas: 1            # > 1 is a gang: all start or none
    preemptible: true
    requeue: on-preemption # never | on-preemption | on-failure (or true / false)
    max_restarts: 3
    time_limit: 2h
    expected_duration: 1h30m
    checkpoint:
      signal: SIGUSR1
      grace: 60s
    isolation: auto        # auto | exclusive | mps | shim | soft | mig
    env:
      WANDB_MODE: offline
    workdir: /data/experiments
    container:             # run in an image (see gpupool.domain.containers)
      image: nvcr.io/nvidia/pytorch:24.05-py3
      mounts: [/data:/data:ro]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial

from gpupool.domain.bounds import (
    CPU_MILLI,
    GPU_MEMORY_MIB,
    GPU_MILLI,
    HOST_MEMORY_MIB,
    MAX_EXEC_BYTES,
    exec_text,
)
from gpupool.domain.containers import build_container
from gpupool.domain.dependency import parse_dependency
from gpupool.domain.errors import Problem, SpecError
from gpupool.domain.interactive import (
    Constraint,
    PtyRequest,
    parse_constraint,
    parse_output,
    parse_pty,
)
from gpupool.domain.jobs import IsolationMode, JobSpec, parse_signal, validate_env_name
from gpupool.domain.mail import parse_mail_type, parse_mail_user
from gpupool.domain.pools import validate_name
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.speckeys import check_keys
from gpupool.domain.specvalues import (
    Collector,
    as_argv,
    as_bool,
    as_bool_text,
    as_int,
    as_isolation,
    as_nodes,
    as_positive_duration,
    as_requeue,
    as_str,
    as_types,
    exec_size,
)
from gpupool.domain.units import parse_cpus, parse_duration, parse_gpus, parse_memory

TYPE_CHECKING = False
if TYPE_CHECKING:  # neither is imported by a plain submit (the CLI's hot path)
    from typing import Any

    import yaml

_NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")
MAX_REPLICAS = 4096
MAX_GRACE_S = 3600.0


def build_spec(
    data: Mapping[str, Any],
    *,
    source: str | None = None,
    lines: Mapping[str, int] | None = None,
) -> JobSpec:
    """Validate a nested mapping (job file or options) and build the spec, or raise SpecError."""
    c = Collector(source, lines or {})
    if not isinstance(data, Mapping):
        c.add("(top)", "a job file must be a mapping of keys, like 'name: train'")
        raise SpecError(c.problems)
    check_keys(c, data, "")

    name = (
        c.parse("name", data.get("name"), lambda v: as_str(v, "name")) if "name" in data else None
    )
    if "name" not in data:
        c.add("name", "missing: every job needs a name, like 'name: train'")
    elif name is not None and not _NAME_RE.match(name):
        c.add("name", "must be 1-200 printable characters")

    command: tuple[str, ...] = ()
    script: str | None = None
    if "command" in data and "script" in data:
        c.add("command", "give either 'command' (an argv list) or 'script' (shell text), not both")
    elif "command" in data:
        command = c.parse("command", data["command"], as_argv) or ()
    elif "script" in data:
        script = c.parse(
            "script", data["script"], lambda v: exec_text(as_str(v, "script"), field="script")
        )
        if script is not None and not script.strip():
            c.add("script", "is empty: write the shell commands to run")
    else:
        c.add("command", "missing: give 'command: [program, args...]' or 'script: shell text'")

    env: dict[str, str] = {}
    raw_env = data.get("env", {})
    if isinstance(raw_env, Mapping):
        for key, value in raw_env.items():
            path = f"env.{key}"
            if c.parse(path, str(key), validate_env_name) is None:
                continue
            if isinstance(value, (dict, list)) or value is None:
                c.add(path, "must be text; quote it")
                continue
            text = c.parse(path, as_bool_text(value), partial(exec_text, field=path))
            if text is not None:
                env[str(key)] = text
    else:
        c.add("env", "must be a mapping of NAME: value")
    size = exec_size(command, script, env)
    if size > MAX_EXEC_BYTES:
        c.add(
            "command",
            f"the command and env add up to {size} bytes, more than {MAX_EXEC_BYTES} a job may "
            "pass to its program: put the data in a file and pass its path, or send it with the "
            "job's working directory (--workdir)",
        )

    res = _build_resources(c, data.get("resources", {}))

    replicas = c.parse(
        "replicas",
        data.get("replicas", 1),
        lambda v: as_int(v, low=1, high=MAX_REPLICAS, what="replicas"),
    )
    preemptible = c.parse("preemptible", data.get("preemptible", False), as_bool)
    requeue = c.parse("requeue", data.get("requeue", "on-preemption"), as_requeue)
    max_restarts = c.parse(
        "max_restarts",
        data.get("max_restarts", 3),
        lambda v: as_int(v, low=0, high=1000, what="max_restarts"),
    )
    time_limit = (
        c.parse("time_limit", data["time_limit"], lambda v: as_positive_duration(v, "time_limit"))
        if data.get("time_limit") is not None
        else None
    )
    expected = (
        c.parse(
            "expected_duration",
            data["expected_duration"],
            lambda v: as_positive_duration(v, "expected_duration"),
        )
        if data.get("expected_duration") is not None
        else None
    )
    if time_limit is not None and expected is not None and expected > time_limit:
        c.add(
            "expected_duration",
            "is longer than time_limit: the job would be stopped before it is expected to end",
        )

    checkpoint = data.get("checkpoint", {})
    signal_name = "SIGTERM"
    grace = 30.0
    if isinstance(checkpoint, Mapping):
        if "signal" in checkpoint:
            signal_name = (
                c.parse("checkpoint.signal", checkpoint["signal"], lambda v: parse_signal(str(v)))
                or "SIGTERM"
            )
        if "grace" in checkpoint:
            parsed = c.parse(
                "checkpoint.grace",
                checkpoint["grace"],
                lambda v: parse_duration(v, field="checkpoint.grace"),
            )
            if parsed is not None and parsed > MAX_GRACE_S:
                c.add("checkpoint.grace", "is longer than 1h: use a grace period of at most 1h")
            elif parsed is not None:
                grace = parsed
    else:
        c.add("checkpoint", "must be a mapping with 'signal' and/or 'grace'")

    isolation = c.parse("isolation", data.get("isolation", "auto"), as_isolation)
    if isolation is IsolationMode.EXCLUSIVE and res is not None and res.is_fractional:
        c.add(
            "isolation",
            "exclusive needs whole GPUs: ask for resources.gpus 1 or more, or use auto/mps/soft",
        )

    def name_field(key: str, default: str | None, kind: str) -> str | None:
        if data.get(key) is None:
            return default
        text = c.parse(key, data[key], lambda v: as_str(v, key))
        if text is None:
            return default
        return c.parse(key, text, lambda v: validate_name(kind, v))  # type: ignore[no-any-return]

    tenant = name_field("tenant", None, "tenant")
    pool = name_field("pool", "default", "pool") or "default"
    priority = name_field("priority", "normal", "priority class") or "normal"
    workdir = (
        c.parse("workdir", data["workdir"], lambda v: as_str(v, "workdir"))
        if data.get("workdir") is not None
        else None
    )

    dependency = (
        c.parse(
            "dependency", data["dependency"], lambda v: parse_dependency(as_str(v, "dependency"))
        )
        if data.get("dependency") is not None
        else None
    )

    nodelist = c.parse("nodelist", data.get("nodelist") or (), lambda v: as_nodes(v, "nodelist"))
    exclude = c.parse("exclude", data.get("exclude") or (), lambda v: as_nodes(v, "exclude"))
    if nodelist and exclude and set(nodelist) <= set(exclude):
        c.add("exclude", "excludes every node of nodelist: the job could run nowhere")

    mail_type = (
        c.parse("mail_type", data["mail_type"], parse_mail_type)
        if data.get("mail_type") is not None
        else ()
    )
    mail_user = (
        c.parse("mail_user", data["mail_user"], parse_mail_user)
        if data.get("mail_user") is not None
        else None
    )
    pty, output, error, time_min, constraint = _interactive_keys(c, data, time_limit)

    container = None
    if data.get("container") is not None:
        container, problems = build_container(data["container"])
        for key, message in problems:
            c.add(key, message)
    if c.problems or res is None:
        raise SpecError(c.problems or [Problem("resources", "invalid", None, source)])
    return JobSpec(
        name=str(name),
        command=command,
        script=script,
        env=env,
        workdir=workdir,
        tenant=tenant,
        pool=pool,
        priority_class=priority,
        resources=res,
        replicas=int(replicas),
        preemptible=bool(preemptible),
        requeue=requeue,
        max_restarts=int(max_restarts),
        time_limit_s=time_limit,
        expected_duration_s=expected,
        checkpoint_signal=signal_name,
        grace_period_s=grace,
        isolation=isolation,
        dependency=dependency,
        nodelist=tuple(nodelist or ()),
        exclude=tuple(exclude or ()),
        container=container,
        mail_type=tuple(mail_type or ()),
        mail_user=mail_user,
        pty=pty,
        stdout_path=output,
        stderr_path=error,
        time_min_s=time_min,
        constraint=constraint,
    )


def _interactive_keys(
    c: Collector, data: Mapping[str, Any], time_limit: float | None
) -> tuple[PtyRequest | None, str | None, str | None, float | None, Constraint | None]:
    """``pty``, ``output``, ``error``, ``time_min`` and ``constraint`` (issue 27), checked."""

    def given(key: str, parser: Callable[[Any], Any]) -> Any:
        return c.parse(key, data[key], parser) if data.get(key) is not None else None

    pty = given("pty", parse_pty)
    output = given("output", lambda v: parse_output(v, "output"))
    error = given("error", lambda v: parse_output(v, "error"))
    time_min = given("time_min", lambda v: as_positive_duration(v, "time_min"))
    if time_min is not None and time_limit is None:
        c.add("time_min", "needs a time_limit (-t): the job runs between time_min and it")
    elif time_min is not None and time_limit is not None and time_min > time_limit:
        c.add("time_min", "is longer than time_limit: give a time_min at most the time limit")
    constraint = given("constraint", parse_constraint)
    if pty is not None and (data.get("replicas") or 1) != 1:
        c.add("pty", "a terminal is for one process: give replicas 1")
    if pty is not None and data.get("container") is not None:
        c.add("pty", "a terminal in a container image is not supported yet: run without --image")
    return pty, output, error, time_min, constraint


def _build_resources(c: Collector, raw: object) -> ResourceRequest | None:
    if not isinstance(raw, Mapping):
        c.add("resources", "must be a mapping like {gpus: 0.5, gpu_memory: 10GiB}")
        return None
    before = len(c.problems)
    gpus = c.parse("resources.gpus", raw.get("gpus", 0), parse_gpus)
    gpu_mem = (
        c.parse(
            "resources.gpu_memory",
            raw["gpu_memory"],
            lambda v: parse_memory(v, field="gpu memory"),
        )
        if raw.get("gpu_memory") is not None
        else None
    )
    types = c.parse("resources.gpu_types", raw.get("gpu_types", []), as_types)
    # No ``cpus``: the default CPU rule (gpupool.domain.resources) decides where it runs.
    cpus = c.parse("resources.cpus", raw.get("cpus", 1), parse_cpus)
    mem = c.parse(
        "resources.memory", raw.get("memory", 0), lambda v: parse_memory(v, field="memory")
    )
    if gpus == 0 and gpu_mem:
        c.add("resources.gpu_memory", "is set but resources.gpus is 0: ask for a GPU share too")
    if gpus == 0 and types:
        c.add("resources.gpu_types", "is set but resources.gpus is 0: ask for a GPU share too")
    for key, bound, value in (
        ("resources.gpus", GPU_MILLI, gpus),
        ("resources.gpu_memory", GPU_MEMORY_MIB, gpu_mem),
        ("resources.cpus", CPU_MILLI, cpus),
        ("resources.memory", HOST_MEMORY_MIB, mem),
    ):
        if value is not None:
            c.parse(key, value, bound.check)
    if len(c.problems) > before:
        return None
    return ResourceRequest(
        gpu_milli=gpus,
        gpu_memory_mib=gpu_mem,
        gpu_types=types,
        cpu_milli=cpus,
        host_memory_mib=mem,
        cpu_auto=raw.get("cpus") is None,
    )


def nest_options(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Turn ``{"resources.gpus": "0.5"}`` into ``{"resources": {"gpus": "0.5"}}``.

    ``None`` values are dropped, so unset CLI options fall back to the defaults.
    """
    out: dict[str, Any] = {}
    for path, value in flat.items():
        if value is None:
            continue
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


# --------------------------------------------------------------------------- YAML


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int) -> None:
        self.key = key
        self.line = line


def _to_python(loader: yaml.SafeLoader, node: yaml.Node, path: str, lines: dict[str, int]) -> Any:
    import yaml  # loaded by parse_job_yaml already

    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(loader.construct_object(key_node, deep=True))
            child = f"{path}.{key}" if path else key
            if key in out:
                raise _DuplicateKey(child, key_node.start_mark.line + 1)
            lines[child] = key_node.start_mark.line + 1
            out[key] = _to_python(loader, value_node, child, lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(loader, item, path, lines) for item in node.value]
    return loader.construct_object(node, deep=True)


def parse_job_yaml(text: str, source: str = "<job file>") -> JobSpec:
    """Parse a job file's text; problems name ``source`` and the line."""
    import yaml  # only for a job file: ``gpupool submit -g 1 -- cmd`` has none (30 ms)

    lines: dict[str, int] = {}
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        data = {} if root is None else _to_python(loader, root, "", lines)
    except _DuplicateKey as dup:
        raise SpecError(
            [Problem(dup.key, "appears twice: keep one of them", dup.line, source)]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(
            [
                Problem(
                    "(yaml)",
                    f"not valid YAML: {problem}; check indentation and quoting",
                    line,
                    source,
                )
            ]
        ) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise SpecError(
            [
                Problem(
                    "(top)", "a job file must be a mapping of keys, like 'name: train'", 1, source
                )
            ]
        )
    return build_spec(data, source=source, lines=lines)
