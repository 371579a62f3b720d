"""Building a :class:`~gpupool.domain.jobs.JobSpec` from what people write.

Two inputs, one validation:

- a YAML **job file** (:func:`parse_job_yaml`), whose problems name the file and line;
- **options** from the CLI or an API request (:func:`build_spec` on a mapping), whose problems
  name the option.

Every problem is collected (not just the first) and raised together as
:class:`~gpupool.domain.errors.SpecError`. Unknown keys are errors with a "did you mean".

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
    JOB_DURATION_S,
    MAX_EXEC_BYTES,
    exec_text,
)
from gpupool.domain.containers import KNOWN_KEYS as CONTAINER_KEYS
from gpupool.domain.containers import build_container
from gpupool.domain.dependency import parse_dependency
from gpupool.domain.errors import InvalidValue, Problem, SpecError
from gpupool.domain.interactive import (
    Constraint,
    PtyRequest,
    parse_constraint,
    parse_output,
    parse_pty,
)
from gpupool.domain.jobs import (
    IsolationMode,
    JobSpec,
    RequeuePolicy,
    parse_signal,
    validate_env_name,
)
from gpupool.domain.mail import parse_mail_type, parse_mail_user
from gpupool.domain.pools import validate_name
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.units import (
    parse_cpus,
    parse_duration,
    parse_gpus,
    parse_memory,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # neither is imported by a plain submit (the CLI's hot path)
    from typing import Any

    import yaml

#: Key paths a job file may contain; ``*`` marks a mapping whose keys are free (env names).
KNOWN_KEYS: tuple[str, ...] = (
    "name",
    "command",
    "script",
    "env",
    "workdir",
    "tenant",
    "pool",
    "priority",
    "resources",
    "resources.gpus",
    "resources.gpu_memory",
    "resources.gpu_types",
    "resources.cpus",
    "resources.memory",
    "replicas",
    "preemptible",
    "requeue",
    "max_restarts",
    "time_limit",
    "expected_duration",
    "checkpoint",
    "checkpoint.signal",
    "checkpoint.grace",
    "isolation",
    # sbatch --dependency (gpupool.domain.dependency)
    "dependency",
    # sbatch --nodelist / --exclude
    "nodelist",
    "exclude",
    # sbatch --mail-type / --mail-user (gpupool.domain.mail)
    "mail_type",
    "mail_user",
    # issue 27's interactive part (gpupool.domain.interactive)
    "pty",
    "output",
    "error",
    "time_min",
    "constraint",
    "container",
    *CONTAINER_KEYS,
)
_MAPPINGS = {"resources", "checkpoint", "env"}
_NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")
MAX_REPLICAS = 4096
MAX_GRACE_S = 3600.0


class _Collector:
    """Gathers problems with their line numbers while a spec is built."""

    def __init__(self, source: str | None, lines: Mapping[str, int]) -> None:
        self.source = source
        self.lines = lines
        self.problems: list[Problem] = []

    def add(self, key: str, message: str) -> None:
        self.problems.append(Problem(key, message, self.lines.get(key), self.source))

    def parse(self, key: str, raw: object, parser: Callable[[Any], Any]) -> Any:
        try:
            return parser(raw)
        except (InvalidValue, ValueError, TypeError) as exc:
            self.add(key, str(exc))
            return None


def _suggest(key: str) -> str:
    leaf = key.rsplit(".", 1)[-1]
    candidates = [k for k in KNOWN_KEYS if not k.endswith("*")]
    import difflib  # only for a key that is wrong (it costs every submit 7 ms)

    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    close = close or [k for k in candidates if k.rsplit(".", 1)[-1] == leaf]
    close = close or difflib.get_close_matches(
        leaf, [k.rsplit(".", 1)[-1] for k in candidates], n=1, cutoff=0.6
    )
    if close:
        match = close[0]
        full = next((k for k in candidates if k == match or k.endswith("." + match)), match)
        return f"did you mean {full!r}?"
    return "see examples/ for the keys a job file takes"


def _as_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise InvalidValue(f"{raw!r} is not true or false")


def _as_int(raw: object, *, low: int, high: int, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise InvalidValue(f"{raw!r} is not a whole number: give {what} as an integer")
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidValue(f"{raw!r} is not a whole number: give {what} as an integer") from None
    if not low <= value <= high:
        raise InvalidValue(f"{value} is out of range: {what} must be between {low} and {high}")
    return value


def _as_str(raw: object, what: str) -> str:
    if isinstance(raw, (dict, list)) or raw is None:
        raise InvalidValue(f"expected text for {what}, got {type(raw).__name__}")
    return str(raw)


def _as_requeue(raw: object) -> RequeuePolicy:
    if isinstance(raw, bool):
        return RequeuePolicy.ON_PREEMPTION if raw else RequeuePolicy.NEVER
    text = str(raw).strip().lower().replace("_", "-")
    for policy in RequeuePolicy:
        if policy.value == text:
            return policy
    choices = ", ".join(p.value for p in RequeuePolicy)
    raise InvalidValue(f"{raw!r} is not a requeue policy: use {choices}, true or false")


def _as_isolation(raw: object) -> IsolationMode:
    text = str(raw).strip().lower()
    for mode in IsolationMode:
        if mode.value == text:
            return mode
    choices = ", ".join(m.value for m in IsolationMode)
    raise InvalidValue(f"{raw!r} is not an isolation mode: use one of {choices}")


def _as_argv(raw: object) -> tuple[str, ...]:
    if isinstance(raw, str):
        raise InvalidValue(
            "command must be a list of arguments, like [python, train.py]; "
            "to run a shell line, use 'script' instead"
        )
    if not isinstance(raw, list) or not raw:
        raise InvalidValue("command must be a non-empty list of arguments, like [python, train.py]")
    argv: list[str] = []
    for i, item in enumerate(raw):
        if isinstance(item, (dict, list)) or item is None:
            raise InvalidValue('every command argument must be text; quote numbers like "10"')
        argv.append(exec_text(str(item), field=f"command argument {i}"))
    if not argv[0]:
        raise InvalidValue("the program (first argument of command) is empty")
    return tuple(argv)


def _as_types(raw: object) -> tuple[str, ...]:
    items = raw.split("|") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        raise InvalidValue("gpu_types must be a list like [A100, H100] or text like 'A100|H100'")
    out = tuple(str(i).strip() for i in items if str(i).strip())
    for item in out:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$", item):
            raise InvalidValue(f"GPU type {item!r} is not valid: use a model name like A100")
    return out


_NODE_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def _as_nodes(raw: object, key: str) -> tuple[str, ...]:
    """``n1,n2`` or ``[n1, n2]`` -> node names (lowercase DNS labels, as agents register)."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        raise InvalidValue(f"{key} must be node names like n1,n2 or a list [n1, n2]")
    out = tuple(dict.fromkeys(str(i).strip() for i in items if str(i).strip()))
    for item in out:
        if not _NODE_RE.match(item):
            raise InvalidValue(
                f"{key}: {item!r} is not a node name: use the names gpupool nodes lists"
            )
    if len(out) > 1000:
        raise InvalidValue(f"{key} names {len(out)} nodes: at most 1000")
    return out


def _as_positive_duration(raw: object, key: str) -> float:
    value = JOB_DURATION_S.check(parse_duration(raw, field=key), field=key)
    if value <= 0:
        raise InvalidValue(f"{key} must be longer than 0")
    return value


def _exec_size(command: tuple[str, ...], script: str | None, env: Mapping[str, str]) -> int:
    """Bytes the program's argv and environment take at exec (each string and its NUL)."""
    strings = [*command, *(("/bin/sh", "-c", script) if script is not None else ())]
    strings += [f"{k}={v}" for k, v in env.items()]
    return sum(len(x.encode("utf-8", "surrogateescape")) + 1 for x in strings)


def build_spec(
    data: Mapping[str, Any],
    *,
    source: str | None = None,
    lines: Mapping[str, int] | None = None,
) -> JobSpec:
    """Validate a nested mapping (job file or options) and build the spec, or raise SpecError."""
    c = _Collector(source, lines or {})
    if not isinstance(data, Mapping):
        c.add("(top)", "a job file must be a mapping of keys, like 'name: train'")
        raise SpecError(c.problems)
    _check_keys(c, data, "")

    name = (
        c.parse("name", data.get("name"), lambda v: _as_str(v, "name")) if "name" in data else None
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
        command = c.parse("command", data["command"], _as_argv) or ()
    elif "script" in data:
        script = c.parse(
            "script", data["script"], lambda v: exec_text(_as_str(v, "script"), field="script")
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
            text = c.parse(path, _as_bool_text(value), partial(exec_text, field=path))
            if text is not None:
                env[str(key)] = text
    else:
        c.add("env", "must be a mapping of NAME: value")
    size = _exec_size(command, script, env)
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
        lambda v: _as_int(v, low=1, high=MAX_REPLICAS, what="replicas"),
    )
    preemptible = c.parse("preemptible", data.get("preemptible", False), _as_bool)
    requeue = c.parse("requeue", data.get("requeue", "on-preemption"), _as_requeue)
    max_restarts = c.parse(
        "max_restarts",
        data.get("max_restarts", 3),
        lambda v: _as_int(v, low=0, high=1000, what="max_restarts"),
    )
    time_limit = (
        c.parse("time_limit", data["time_limit"], lambda v: _as_positive_duration(v, "time_limit"))
        if data.get("time_limit") is not None
        else None
    )
    expected = (
        c.parse(
            "expected_duration",
            data["expected_duration"],
            lambda v: _as_positive_duration(v, "expected_duration"),
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

    isolation = c.parse("isolation", data.get("isolation", "auto"), _as_isolation)
    if isolation is IsolationMode.EXCLUSIVE and res is not None and res.is_fractional:
        c.add(
            "isolation",
            "exclusive needs whole GPUs: ask for resources.gpus 1 or more, or use auto/mps/soft",
        )

    def name_field(key: str, default: str | None, kind: str) -> str | None:
        if data.get(key) is None:
            return default
        text = c.parse(key, data[key], lambda v: _as_str(v, key))
        if text is None:
            return default
        return c.parse(key, text, lambda v: validate_name(kind, v))  # type: ignore[no-any-return]

    tenant = name_field("tenant", None, "tenant")
    pool = name_field("pool", "default", "pool") or "default"
    priority = name_field("priority", "normal", "priority class") or "normal"
    workdir = (
        c.parse("workdir", data["workdir"], lambda v: _as_str(v, "workdir"))
        if data.get("workdir") is not None
        else None
    )

    dependency = (
        c.parse(
            "dependency", data["dependency"], lambda v: parse_dependency(_as_str(v, "dependency"))
        )
        if data.get("dependency") is not None
        else None
    )

    nodelist = c.parse("nodelist", data.get("nodelist") or (), lambda v: _as_nodes(v, "nodelist"))
    exclude = c.parse("exclude", data.get("exclude") or (), lambda v: _as_nodes(v, "exclude"))
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
    c: _Collector, data: Mapping[str, Any], time_limit: float | None
) -> tuple[PtyRequest | None, str | None, str | None, float | None, Constraint | None]:
    """``pty``, ``output``, ``error``, ``time_min`` and ``constraint`` (issue 27), checked."""

    def given(key: str, parser: Callable[[Any], Any]) -> Any:
        return c.parse(key, data[key], parser) if data.get(key) is not None else None

    pty = given("pty", parse_pty)
    output = given("output", lambda v: parse_output(v, "output"))
    error = given("error", lambda v: parse_output(v, "error"))
    time_min = given("time_min", lambda v: _as_positive_duration(v, "time_min"))
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


def _as_bool_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _build_resources(c: _Collector, raw: object) -> ResourceRequest | None:
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
    types = c.parse("resources.gpu_types", raw.get("gpu_types", []), _as_types)
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


def _check_keys(c: _Collector, data: Mapping[str, Any], prefix: str) -> None:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if path.startswith("env."):
            continue
        if path not in KNOWN_KEYS:
            c.add(path, f"unknown key: {_suggest(path)}")
            continue
        if path in _MAPPINGS and isinstance(value, Mapping) and path != "env":
            _check_keys(c, value, path + ".")


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
