"""The options of the hot verbs (``submit``/``run``, ``queue``, ``cancel``, ``show``), declared
once, and a parser for them that costs next to nothing.

``gpupool submit`` used to pay about 0.8 CPU-s before it sent anything, nearly all of it
imports: typer and click to read its options, httpx for one request, pydantic for one answer,
rich for one line. sbatch pays 18 ms. So a hot verb now runs without any of them
(:mod:`gpupool.cli.hot`), and its options are **declared here as data**, not as a typer
signature, so that both readers come from the one declaration:

- :func:`parse` reads ``argv`` with the table, as click would (``-g 0.5``, ``-g0.5``,
  ``--gpus 0.5``, ``--gpus=0.5``, repeated options, ``--flag/--no-flag``, ``--``); anything it
  is not sure about (``--help``, an unknown option, a missing value, ``5x`` for an integer, a
  short-flag cluster) answers ``None`` and the command goes through typer instead, which
  prints today's help and today's errors. The fast parser never guesses.
- :func:`gpupool.cli.typed.command` builds the typer command (``--help``, shell use through
  ``CliRunner``, the slow path) from the same table: the same flags, help and defaults.

Both hand the command the same ``params`` dict (``dest -> value``, defaults filled in), and the
command's one implementation (:mod:`gpupool.cli.hotjobs`) runs the same way under either.

**Adding an option to submit** (``run`` shares the table): add one :class:`Opt` to
:data:`SUBMIT` below, then read ``params["your_dest"]`` where the value is used (a job-file key:
one line in :func:`gpupool.cli.submitspec.build_submission`'s ``flat`` mapping, and its name in
``gpupool.cli.session.OPTION_NAMES`` for error messages). Nothing else: ``--help``, the fast
parser and the typer path all follow, and ``tests/cli/test_options.py`` checks the two parsers
agree on every option of every table (each spelling: ``-x V``, ``-xV``, ``--long V``,
``--long=V``). An option only ``run`` takes (``--pty``): a ``RUN = (*SUBMIT, Opt(...))`` table
here, used for ``run`` in :mod:`gpupool.cli.jobs`. A new *hot verb*: a table here and an entry
in :data:`gpupool.cli.hot.HOT`; a new verb that is not hot can still be declared here and made
with :func:`gpupool.cli.typed.command` (``update`` is), or written as a typer function as before.
Flags taken already: ``-e`` is ``--env`` (Slurm's ``-e`` is ``--error``), ``-t`` is ``--time``,
``-a`` is ``--array``, ``-d`` is ``--dependency``.

This module imports nothing: it runs on every hot command (``pathlib`` alone would cost 12 ms;
a ``"path"`` option's value becomes a ``Path`` when one is given).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


class Opt:
    """One option: its flags (``("-g", "--gpus")``), where its value goes (``dest``), its help.

    ``kind`` is the value's type: ``str``, ``int``, ``"path"`` (a ``pathlib.Path``) or
    ``bool``. A ``bool`` option is a flag (``--hold``, default ``False``), or with ``off`` its
    negative too (``--preemptible/--no-preemptible``, default ``None``: not given). ``many``:
    repeatable, the values in a list (``None`` when never given). ``typer`` holds extra
    keywords for ``typer.Option`` (e.g. ``show_default=False``).
    """

    __slots__ = ("default", "dest", "flags", "help", "kind", "many", "off", "typer")

    def __init__(
        self,
        dest: str,
        flags: tuple[str, ...],
        help: str,
        *,
        kind: type | str = str,
        many: bool = False,
        off: tuple[str, ...] = (),
        default: Any = None,
        typer: dict[str, Any] | None = None,
    ) -> None:
        self.dest = dest
        self.flags = flags
        self.help = help
        self.kind = kind
        self.many = many
        self.off = off
        self.default = False if kind is bool and not off and default is None else default
        self.typer = typer or {}

    @property
    def flag(self) -> bool:
        """Takes no value (``--hold``, ``--preemptible``, ``--no-preemptible``)."""
        return self.kind is bool


class Arg:
    """The positional arguments: one (``job_id``) or, with ``many``, a list (a command)."""

    __slots__ = ("dest", "help", "many", "required")

    def __init__(self, dest: str, help: str, *, many: bool = False, required: bool = True) -> None:
        self.dest = dest
        self.help = help
        self.many = many
        self.required = required and not many


Param = Opt | Arg

# ------------------------------------------------------------------ shared by every client verb

SERVER = Opt(
    "server",
    ("--server",),
    "server URL (default: $GPUPOOL_SERVER, gpupool login's file, then a local pool)",
    typer={"show_default": False},
)
TOKEN = Opt("token", ("--token",), "API token (default: $GPUPOOL_TOKEN, then as for --server)")
JSON = Opt("json_out", ("--json",), "print JSON for machines", kind=bool)
COMMON = (SERVER, TOKEN, JSON)

# Job options shared by submit/run and update (sbatch / scontrol names).
QOS = Opt("qos", ("-q", "--qos"), "priority class, e.g. low, normal, high")
TIME = Opt("time_limit", ("-t", "--time"), "time limit: 90 (minutes), 1:30:00, 2-12")
EXPECTED = Opt("expected", ("--expected",), "expected run time, for start estimates")
PREEMPTIBLE = Opt(
    "preemptible", ("--preemptible",), "may be preempted", kind=bool, off=("--no-preemptible",)
)

# ------------------------------------------------------------------ submit and run (sbatch, srun)

JOB_NAME = Opt("job_name", ("-J", "--job-name"), "job name")
# A job's resources (submit, run, update: job-file keys resources.*).
GPUS = Opt("gpus", ("-g", "--gpus"), "GPU share: 0.5, 50%, 500m, or whole: 2")
GPU_MEM = Opt("gpu_mem", ("--gpu-mem",), "GPU memory per device, e.g. 10GiB")
GPU_TYPE = Opt("gpu_type", ("--gpu-type",), "allowed GPU model (repeat, or A100|H100)", many=True)
CPUS = Opt("cpus", ("-c", "--cpus"), "host CPUs, e.g. 4")
MEM = Opt("mem", ("--mem",), "host memory, e.g. 32GiB")
RESOURCES = (GPUS, GPU_MEM, GPU_TYPE, CPUS, MEM)

SUBMIT: tuple[Param, ...] = (
    Arg("argv", "the command, after --", many=True),
    JOB_NAME,
    *RESOURCES,
    Opt("pool", ("-p", "--pool"), "pool (partition)"),
    Opt("account", ("-A", "--account"), "tenant to charge (default: yours)"),
    QOS,
    TIME,
    EXPECTED,
    PREEMPTIBLE,
    Opt("replicas", ("--replicas",), "replicas of a gang (all start or none)", kind=int),
    Opt(
        "requeue",
        ("--requeue",),
        "back to the queue after preemption",
        kind=bool,
        off=("--no-requeue",),
    ),
    Opt("max_restarts", ("--max-restarts",), "requeue cap", kind=int),
    Opt("checkpoint_signal", ("--checkpoint-signal",), "signal sent before a stop"),
    Opt("grace", ("--grace",), "time between that signal and the kill"),
    Opt("env", ("-e", "--env"), "KEY=VALUE for the job (repeat)", many=True),
    Opt("wrap", ("--wrap",), "run this shell line"),
    Opt("workdir", ("--workdir",), "folder the job runs in (see below)", kind="path"),
    Opt("isolation", ("--isolation",), "auto, exclusive, mps, shim, soft or mig"),
    Opt("file", ("-f", "--file"), "job file; options override its keys", kind="path"),
    Opt(
        "export",
        ("--export",),
        "your environment for the job: ALL (default), NONE, or NAME,NAME=value,...",
    ),
    Opt("image", ("--image",), "run it in this image"),
    Opt("container_mounts", ("--container-mounts",), "SRC:DST[:ro],... (repeat)", many=True),
    Opt("container_workdir", ("--container-workdir",), "start folder in the image"),
    Opt("container_env", ("--container-env",), "NAME=VALUE in the image", many=True),
    Opt("container_engine", ("--container-engine",), "podman or docker"),
    Opt("hold", ("-H", "--hold"), "submit it held: it waits for gpupool release", kind=bool),
    Opt("array", ("-a", "--array"), "a job array: 0-9, 0-20:5 or 1,3,8-10 (submit only)"),
    Opt(
        "queue_anyway",
        ("--queue-anyway",),
        "queue it even if no node of the pool could hold it, for nodes yet to join",
        kind=bool,
    ),
    Opt(
        "dependency",
        ("-d", "--dependency"),
        "wait for other jobs: afterok:ID[:ID], afterany, afternotok, aftercorr, "
        "singleton (',' all, '?' any)",
    ),
    Opt("begin", ("--begin",), "not before: now+90, now+2hours, 16:00, 2026-12-24T08:00"),
    Opt("nodelist", ("-w", "--nodelist"), "only on these nodes: n1,n2"),
    Opt("exclude", ("-x", "--exclude"), "never on these nodes: n3,n4"),
    # issue 27's interactive part (sbatch -o/-e, --time-min, -C; srun --pty)
    Opt("output", ("-o", "--output"), "also write stdout to this file on the node: %j %x %a"),
    Opt("error", ("--error",), "also write stderr to this file on the node (default: -o)"),
    Opt("time_min", ("--time-min",), "backfill may start it with a time limit this short"),
    Opt("constraint", ("-C", "--constraint"), 'node features: "ib&a100x8", "a100|h100"'),
    Opt(
        "mail_type", ("--mail-type",), "notify when: BEGIN, END, FAIL, REQUEUE, ALL (joined by ',')"
    ),
    Opt("mail_user", ("--mail-user",), "notify whom: an e-mail address or an https:// webhook"),
    Opt("pty", ("--pty",), "run only: the job gets your terminal (srun --pty)", kind=bool),
    Opt("parsable", ("--parsable",), "print only the job id", kind=bool),
    *COMMON,
)

# ------------------------------------------------------------------ update (scontrol update)

#: ``gpupool update``: not a hot verb, but its job options are submit's, declared once above.
UPDATE: tuple[Param, ...] = (
    Arg("job_id", "job id"),
    JOB_NAME,
    QOS,
    TIME,
    EXPECTED,
    PREEMPTIBLE,
    *RESOURCES,
    *COMMON,
)

# ------------------------------------------------------------------ queue (squeue)

QUEUE: tuple[Param, ...] = (
    Opt("user", ("-u", "--user"), "only this user's jobs"),
    Opt("account", ("-A", "--account"), "only this tenant"),
    Opt("pool", ("-p", "--pool"), "only this pool"),
    Opt("states", ("-t", "--states"), "states (names or codes, repeat)", many=True),
    Opt("me", ("--me",), "only my jobs", kind=bool),
    Opt("array", ("-a", "--array"), "only the tasks of this job array"),
    *COMMON,
)

# ------------------------------------------------------------------ cancel (scancel)

USER = Opt("user", ("-u", "--user"), "only this user's jobs")
NAME = Opt("name", ("-n", "--name"), "only jobs of this name")
ARRAY = Opt("array", ("-a", "--array"), "only the tasks of this job array")
ACCOUNT = Opt("account", ("-A", "--account"), "only this tenant's jobs")
POOL = Opt("pool", ("-p", "--pool"), "only jobs of this pool")
JOB_IDS = Arg("job_ids", "job ids, or job array ids for all their tasks", many=True)

CANCEL: tuple[Param, ...] = (
    JOB_IDS,
    USER,
    NAME,
    Opt("state", ("-t", "--state"), "only these states (names or codes, repeat)", many=True),
    ARRAY,
    ACCOUNT,
    POOL,
    Opt("reason", ("--reason",), "why, for the record"),
    *COMMON,
)

# ------------------------------------------------------------------ show (scontrol show job)

SHOW: tuple[Param, ...] = (Arg("job_id", "job id, job array id, or ARRAY_INDEX"), *COMMON)


# ------------------------------------------------------------------ the fast parser


def defaults(params: Sequence[Param]) -> dict[str, Any]:
    """Every ``dest`` of ``params`` with the value it has when not given."""
    out: dict[str, Any] = {}
    for p in params:
        out[p.dest] = None if isinstance(p, Arg) else p.default
    return out


def _lookup(params: Sequence[Param]) -> dict[str, tuple[Opt, Any]]:
    """Each flag and what it means: the option and, for a flag, the value it sets."""
    found: dict[str, tuple[Opt, Any]] = {}
    for p in params:
        if isinstance(p, Opt):
            for flag in p.flags:
                found[flag] = (p, True)
            for flag in p.off:
                found[flag] = (p, False)
    return found


def _convert(opt: Opt, raw: str) -> Any:
    if opt.kind is int:
        text = raw.strip()
        if not text or not (text.lstrip("+-").isdigit()):
            raise ValueError(raw)  # click's own error is the one to print: the slow path
        return int(text)
    if opt.kind == "path":
        from pathlib import Path

        return Path(raw)
    return raw


def parse(
    params: Sequence[Param], argv: Sequence[str], *, interspersed: bool = True
) -> dict[str, Any] | None:
    """``argv`` read as click reads it for a command with ``params``; ``None`` when this parser
    is not sure it would read it the same way (the caller then lets typer do it).

    ``interspersed=False`` (submit, run): the first argument that is not an option starts the
    command, and everything after it is the command's, as with ``sbatch script args``."""
    flags = _lookup(params)
    args = [p for p in params if isinstance(p, Arg)]
    out = defaults(params)
    positional: list[str] = []
    rest = list(argv)
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if token == "--":
            positional += rest[i:]
            break
        if token == "--help" or token.startswith("--help="):
            return None
        if not token.startswith("-") or token == "-":
            positional.append(token)
            if not interspersed:
                positional += rest[i:]
                break
            continue
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if not token.startswith("--") and len(token) > 2:
            name, value, eq = token[:2], token[2:], "="  # -g0.5
        meaning = flags.get(name)
        if meaning is None:
            return None  # unknown to this table (or a typo): typer says so, with suggestions
        opt, on = meaning
        if opt.flag:
            if eq:
                return None  # --hold=x, or a cluster like -Hq: click's business
            out[opt.dest] = on
            continue
        if not eq:
            if i >= len(rest):
                return None  # "requires an argument": click's message
            value = rest[i]
            i += 1
        try:
            converted = _convert(opt, value)
        except ValueError:
            return None
        if opt.many:
            out[opt.dest] = [*(out[opt.dest] or ()), converted]
        else:
            out[opt.dest] = converted
    return _place(args, positional, out)


def _place(args: list[Arg], positional: list[str], out: dict[str, Any]) -> dict[str, Any] | None:
    """The positional values into the table's arguments; ``None`` when they do not fit."""
    if not args:
        return None if positional else out
    arg = args[0]  # the hot verbs have one argument each
    if arg.many:
        out[arg.dest] = positional or None
        return out
    if len(positional) != 1:
        return None  # "missing argument" or "got unexpected extra argument": click's words
    out[arg.dest] = positional[0]
    return out
