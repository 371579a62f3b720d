"""Job commands, in Slurm's words: ``submit`` (sbatch), ``run`` (srun), ``queue`` (squeue);
reading one job (``show``, ``logs``, ``fetch``, ``history``) is :mod:`gpupool.cli.jobinfo`,
changing queued ones (``cancel``, ``hold``, ...) :mod:`gpupool.cli.jobctl`.

``submit`` turns its options into job-file keys (``-g 0.5`` is ``resources.gpus: 0.5``) and
validates them with :func:`gpupool.domain.jobspec.build_spec` over
:func:`~gpupool.domain.jobspec.nest_options`, the rules a job file and the server use, so a
bad value fails here with the option's name. With ``-f job.yaml`` the file is the base and the
options given override its keys.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
import yaml

from gpupool.cli import render
from gpupool.cli.session import (
    ExpectedOpt,
    JsonOpt,
    PreemptibleOpt,
    QosOpt,
    ServerOpt,
    TimeOpt,
    TokenOpt,
    emit,
    fail,
    handle_errors,
    print_json,
    session,
)
from gpupool.cli.sliceopts import AccountOpt, CpusOpt, GpuMemOpt, GpusOpt, MemOpt, PoolOpt
from gpupool.client.errors import EXIT_FAILED
from gpupool.client.logs import LogPiece, PendingNotice
from gpupool.client.sdk import Client, merge_spec
from gpupool.domain.arrays import parse_array
from gpupool.domain.clock import SystemClock
from gpupool.domain.dependency import parse_begin
from gpupool.domain.environ import own_venv, without_venv
from gpupool.domain.errors import InvalidValue
from gpupool.domain.jobs import reserved_env_rule, validate_env_name
from gpupool.domain.jobspec import build_spec, nest_options, parse_job_yaml
from gpupool.domain.states import ACTIVE_STATES, JobState
from gpupool.schemas.jobs import JobView

ACTIVE = [s.value for s in (JobState.PENDING, JobState.REQUEUED, *sorted(ACTIVE_STATES, key=str))]


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise fail(f"-e {pair!r} is not KEY=VALUE: write it like -e WANDB_MODE=offline")
        env[key] = value
    return env


def export_env(export: str, environ: Mapping[str, str], venv: Path | None = None) -> dict[str, str]:
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


def build_submission(
    *,
    argv: list[str] | None,
    job_name: str | None,
    gpus: str | None,
    gpu_mem: str | None,
    gpu_type: list[str] | None,
    cpus: str | None,
    mem: str | None,
    pool: str | None,
    account: str | None,
    qos: str | None,
    time_limit: str | None,
    expected: str | None,
    preemptible: bool | None,
    replicas: int | None,
    requeue: bool | None,
    max_restarts: int | None,
    checkpoint_signal: str | None,
    grace: str | None,
    env: list[str] | None,
    wrap: str | None,
    workdir: Path | None,
    isolation: str | None,
    file: Path | None,
    export: str | None = None,
    dependency: str | None = None,
    nodelist: str | None = None,
    exclude: str | None = None,
    image: str | None = None,
    container_mounts: list[str] | None = None,
    container_workdir: str | None = None,
    container_env: list[str] | None = None,
    container_engine: str | None = None,
    mail_type: str | None = None,
    mail_user: str | None = None,
    output: str | None = None,
    error: str | None = None,
    time_min: str | None = None,
    constraint: str | None = None,
    pty: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The job-file mapping for ``submit``'s options (validated; raises SpecError).

    The job's env is the submitter's exported environment (``--export``, ALL by default),
    then the job file's, then ``-e``; ``PWD`` is the submit directory, where the job starts
    when its node can see it (see gpupool.agent.env)."""
    if argv and wrap is not None:
        raise fail("give either a command after -- or --wrap, not both")
    base: dict[str, Any] = {}
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise fail(f"cannot read {file}: {exc.strerror}") from None
        parse_job_yaml(text, source=str(file))  # problems with file and line
        base = yaml.safe_load(text) or {}
    flat: dict[str, Any] = {
        "name": job_name,
        "resources.gpus": gpus,
        "resources.gpu_memory": gpu_mem,
        "resources.gpu_types": "|".join(gpu_type) if gpu_type else None,
        "resources.cpus": cpus,
        "resources.memory": mem,
        "pool": pool,
        "tenant": account,
        "priority": qos,
        "time_limit": time_limit,
        "expected_duration": expected,
        "preemptible": preemptible,
        "replicas": replicas,
        "requeue": None if requeue is None else ("on-preemption" if requeue else "never"),
        "max_restarts": max_restarts,
        "checkpoint.signal": checkpoint_signal,
        "checkpoint.grace": grace,
        "isolation": isolation,
        "dependency": dependency,
        "nodelist": nodelist,
        "exclude": exclude,
        "container.image": image,  # --image and --container-*: like pyxis's options
        "container.mounts": ",".join(container_mounts) if container_mounts else None,
        "container.workdir": container_workdir,
        "container.env": _env_pairs(container_env) if container_env else None,
        "container.engine": container_engine,
        "mail_type": mail_type,  # sbatch --mail-type / --mail-user (gpupool.domain.mail)
        "mail_user": mail_user,
        "output": output,  # sbatch -o/--error, --time-min, --constraint; run --pty
        "error": error,
        "time_min": time_min,
        "constraint": constraint,
        "pty": dict(pty) if pty is not None else None,
    }
    if workdir is not None and not workdir.is_dir():
        raise fail(f"--workdir {workdir} is not a folder: give an existing folder")
    overrides = nest_options(flat)
    exported = export_env("ALL" if export is None else export, os.environ, own_venv())
    exported["PWD"] = os.getcwd()
    base["env"] = {**exported, **(base.get("env") or {})}
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
            spec["name"] = Path(argv[0]).name or "job"
        elif wrap is not None:
            spec["name"] = "wrap"
    if "command" not in spec and "script" not in spec:
        raise fail(
            "nothing to run: give a command after --, e.g. gpupool submit -g 0.5 -- python "
            "train.py, or --wrap 'shell line', or -f job.yaml"
        )
    build_spec(spec)
    return spec


def _submit_command(  # noqa: PLR0917 - sbatch-like options
    argv: Annotated[list[str] | None, typer.Argument(help="the command, after --")] = None,
    job_name: Annotated[str | None, typer.Option("-J", "--job-name", help="job name")] = None,
    gpus: GpusOpt = None,
    gpu_mem: GpuMemOpt = None,
    gpu_type: Annotated[
        list[str] | None,
        typer.Option("--gpu-type", help="allowed GPU model (repeat, or A100|H100)"),
    ] = None,
    cpus: CpusOpt = None,
    mem: MemOpt = None,
    pool: PoolOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    time_limit: TimeOpt = None,
    expected: ExpectedOpt = None,
    preemptible: PreemptibleOpt = None,
    replicas: Annotated[
        int | None, typer.Option("--replicas", help="replicas of a gang (all start or none)")
    ] = None,
    requeue: Annotated[
        bool | None,
        typer.Option("--requeue/--no-requeue", help="back to the queue after preemption"),
    ] = None,
    max_restarts: Annotated[int | None, typer.Option("--max-restarts", help="requeue cap")] = None,
    checkpoint_signal: Annotated[
        str | None, typer.Option("--checkpoint-signal", help="signal sent before a stop")
    ] = None,
    grace: Annotated[
        str | None, typer.Option("--grace", help="time between that signal and the kill")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("-e", "--env", help="KEY=VALUE for the job (repeat)")
    ] = None,
    wrap: Annotated[str | None, typer.Option("--wrap", help="run this shell line")] = None,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="folder the job runs in (see below)")
    ] = None,
    isolation: Annotated[
        str | None, typer.Option("--isolation", help="auto, exclusive, mps, shim, soft or mig")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("-f", "--file", help="job file; options override its keys")
    ] = None,
    export: Annotated[
        str | None,
        typer.Option(
            "--export",
            help="your environment for the job: ALL (default), NONE, or NAME,NAME=value,...",
        ),
    ] = None,
    image: Annotated[str | None, typer.Option("--image", help="run it in this image")] = None,
    container_mounts: Annotated[
        list[str] | None, typer.Option("--container-mounts", help="SRC:DST[:ro],... (repeat)")
    ] = None,
    container_workdir: Annotated[
        str | None, typer.Option("--container-workdir", help="start folder in the image")
    ] = None,
    container_env: Annotated[
        list[str] | None, typer.Option("--container-env", help="NAME=VALUE in the image")
    ] = None,
    container_engine: Annotated[
        str | None, typer.Option("--container-engine", help="podman or docker")
    ] = None,
    hold: Annotated[
        bool, typer.Option("-H", "--hold", help="submit it held: it waits for gpupool release")
    ] = False,
    array: Annotated[
        str | None,
        typer.Option("-a", "--array", help="a job array: 0-9, 0-20:5 or 1,3,8-10 (submit only)"),
    ] = None,
    queue_anyway: Annotated[
        bool,
        typer.Option(
            "--queue-anyway",
            help="queue it even if no node of the pool could hold it, for nodes yet to join",
        ),
    ] = False,
    dependency: Annotated[
        str | None,
        typer.Option(
            "-d",
            "--dependency",
            help="wait for other jobs: afterok:ID[:ID], afterany, afternotok, aftercorr, "
            "singleton (',' all, '?' any)",
        ),
    ] = None,
    begin: Annotated[
        str | None,
        typer.Option("--begin", help="not before: now+90, now+2hours, 16:00, 2026-12-24T08:00"),
    ] = None,
    nodelist: Annotated[
        str | None, typer.Option("-w", "--nodelist", help="only on these nodes: n1,n2")
    ] = None,
    exclude: Annotated[
        str | None, typer.Option("-x", "--exclude", help="never on these nodes: n3,n4")
    ] = None,
    mail_type: Annotated[
        str | None,
        typer.Option(
            "--mail-type", help="notify when: BEGIN, END, FAIL, REQUEUE, ALL (joined by ',')"
        ),
    ] = None,
    mail_user: Annotated[
        str | None,
        typer.Option("--mail-user", help="notify whom: an e-mail address or an https:// webhook"),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", help="also write stdout to this file on the node: %j %x %a"),
    ] = None,
    error: Annotated[
        str | None,
        typer.Option("--error", help="also write stderr to this file on the node (default: -o)"),
    ] = None,
    time_min: Annotated[
        str | None,
        typer.Option("--time-min", help="backfill may start it with a time limit this short"),
    ] = None,
    constraint: Annotated[
        str | None,
        typer.Option("-C", "--constraint", help='node features: "ib&a100x8", "a100|h100"'),
    ] = None,
    pty: Annotated[
        bool, typer.Option("--pty", help="run only: the job gets your terminal (srun --pty)")
    ] = False,
    parsable: Annotated[bool, typer.Option("--parsable", help="print only the job id")] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The option list of ``submit`` and ``run`` (see :func:`_variant`)."""
    _submit(dict(locals()), follow=False)


def _submit(params: dict[str, Any], *, follow: bool) -> None:
    server, token = params["server"], params["token"]
    json_out, parsable = params["json_out"], params["parsable"]
    keys = inspect.signature(build_submission).parameters
    array: str | None = params["array"]
    if array is not None and follow:
        raise fail("--array submits many jobs: use gpupool submit --array, then gpupool queue")
    want_pty = bool(params.get("pty"))
    if want_pty and not follow:
        raise fail("--pty gives a job your terminal: use gpupool run --pty, e.g. run --pty bash")
    with handle_errors(cli_options=True):
        spec = build_submission(**{k: params[k] for k in keys if k in params and k != "pty"})
        if array is not None:
            parse_array(array)  # refused here, before anything is uploaded
        begin_text: str | None = params.get("begin")
        begin = None if begin_text is None else parse_begin(begin_text, SystemClock().now())
    with session(server, token) as gp:
        if want_pty:
            from gpupool.cli import ptyrun  # only a terminal pays for termios and sockets

            listener, endpoint = ptyrun.listen(gp.server)
            spec["pty"] = endpoint  # checked again by the server, as the whole spec
        workdir: Path | None = params.get("workdir")
        upload = gp.upload_workdir(workdir) if workdir is not None else None
        if array is not None:
            tasks = gp.submit_array(
                spec,
                array=array,
                workdir_upload=upload,
                hold=params["hold"],
                queue_anyway=params["queue_anyway"],
                begin=begin,
            )
            if parsable:
                typer.echo("\n".join(t.id for t in tasks))
            elif json_out:
                print_json(tasks)
            else:
                typer.echo(
                    f"Submitted array {tasks[0].array_id} of {len(tasks)} jobs "
                    f"({tasks[0].name} .. {tasks[-1].name}) to pool {tasks[0].pool}"
                )
            return
        job = gp.submit(
            spec,
            workdir_upload=upload,
            hold=params["hold"],
            queue_anyway=params["queue_anyway"],
            begin=begin,
        )
        if parsable:
            typer.echo(job.id)
        elif json_out and not follow:
            print_json(job)
        else:
            typer.echo(f"Submitted job {job.id} ({job.name}) to pool {job.pool}", err=follow)
        if follow and want_pty:
            raise typer.Exit(ptyrun.session(gp, job, listener, endpoint["key"], _exit_code))
        if follow:
            raise typer.Exit(_follow(gp, job))


class _Terminated(Exception):
    """SIGTERM reached ``gpupool run`` (a CI system cancelling its step, ``kill``)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def _follow(gp: Client, job: JobView) -> int:
    """Stream the job's stdout to stdout and its stderr to stderr (like srun), byte for byte,
    until it ends; the exit code to leave with. While it waits, why it waits is said on
    stderr each time the reason changes.

    Ctrl-C cancels the job (as with srun) and exits 130; SIGTERM (how CI systems cancel a
    step) cancels it too and exits 143.
    """
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    notice = PendingNotice(lambda line: typer.echo(line, err=True))
    try:
        write_output(
            gp.output(job.id, streams=("stdout", "stderr"), follow=True, on_poll=notice),
            gang=job.replicas > 1,
        )
        final = gp.wait(job.id, on_poll=notice)
    except (KeyboardInterrupt, _Terminated) as exc:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one cancel, even if CI sends more
        what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        gp.cancel(job.id, reason=f"interrupted: {what} on gpupool run")
        typer.echo(f"\ncancelled job {job.id}", err=True)
        return 130 if isinstance(exc, KeyboardInterrupt) else 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _exit_code(final)


def _exit_code(final: JobView) -> int:
    """``run``'s exit status for a job that ended as ``final`` (its own exit code when it
    failed with one), saying on stderr how it ended when not ``COMPLETED``."""
    if final.state == "COMPLETED":
        return 0
    typer.echo(
        f"job {final.id} ended {final.state}"
        + (f" ({final.reason})" if final.reason else "")
        + f": see gpupool show {final.id}",
        err=True,
    )
    return final.exit_code if final.exit_code not in (None, 0) else EXIT_FAILED


def write_output(pieces: Iterable[LogPiece], *, gang: bool, one_stream: bool = False) -> None:
    """Write log pieces as they come: stdout's bytes to stdout, stderr's to stderr (with
    ``one_stream``, all to stdout), exactly; a gang's lines prefixed with their rank. What is
    missing is said on stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    sinks = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
    if one_stream:
        sinks["stderr"] = sinks["stdout"]
    partial: dict[tuple[int, str], bytes] = {}
    for piece in pieces:
        sink = sinks[piece.stream]
        key = (piece.replica, piece.stream)
        prefix = f"[{piece.replica}] ".encode() if gang else b""
        text = piece.notice()
        if text is not None:
            if partial.get(key):
                sink.write(prefix + partial.pop(key) + b"\n")
                sink.flush()
            sys.stderr.buffer.write(prefix + text.encode() + b"\n")
            sys.stderr.buffer.flush()
        data = piece.data
        if gang:
            data = partial.pop(key, b"") + data
            cut = data.rfind(b"\n") + 1
            partial[key] = data[cut:]
            data = b"".join(prefix + line for line in data[:cut].splitlines(keepends=True))
        sink.write(data)
        sink.flush()
    for (rank, stream), rest in partial.items():
        if rest:
            sinks[stream].write(f"[{rank}] ".encode() + rest)
            sinks[stream].flush()


SUBMIT_HELP = """Submit a job to the pool (like sbatch).

    Examples:

      gpupool submit -J train -g 0.5 --gpu-mem 10GiB -- python train.py --epochs 10

      gpupool submit -g 2 --gpu-type A100 -q high -t 4:00:00 --wrap "python a.py | tee log"

      gpupool submit -f examples/train.yaml -p research --parsable

      gpupool submit -a 0-9 -g 0.25 --wrap 'python sweep.py --trial $GPUPOOL_ARRAY_TASK_ID'

    --workdir DIR: the folder is packed (without .git, __pycache__, .venv) and uploaded (at
    most 100 MiB packed), and the job runs in a copy of it on its node; gpupool fetch JOB DEST
    brings back what it wrote there. Without it, the job starts in the directory you submit
    from when its node can see it (a gpupool up pool always can), else in a folder of its own.

    --export (like sbatch): ALL (the default) gives the job your environment, but names
    gpupool sets (CUDA_VISIBLE_DEVICES, GPUPOOL_*...) and gpupool's own virtual environment;
    NONE gives none of it; FOO,BAR=1 only those (ALL,BAR=1 adds to ALL). -e KEY=VALUE wins.

    --array: one job per index, named NAME[INDEX], each with GPUPOOL_ARRAY_TASK_ID (and
    GPUPOOL_ARRAY_JOB_ID, _TASK_COUNT, _TASK_MIN, _TASK_MAX); --parsable prints every id.
    """

RUN_HELP = """Submit a job, stream its output until it ends, exit with its exit code (like srun).

    Takes the same options as submit.

    Examples:

      gpupool run -g 0.25 -- python -c "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"

      gpupool run --wrap "nvidia-smi; python eval.py" -t 30

      gpupool run -g 1 -t 20 --workdir . -- pytest tests/gpu    # a CI step on the pool

    The job's stdout goes to stdout and its stderr to stderr, byte for byte; while it waits,
    why it waits is said on stderr each time the reason changes. Ctrl-C cancels the job and
    exits 130; SIGTERM (a CI system cancelling the step) cancels it and exits 143.
    """


def _variant(name: str, doc: str, follow: bool) -> Callable[..., None]:
    """``submit`` and ``run``: one option list, two behaviours."""

    @functools.wraps(_submit_command)
    def command(**params: Any) -> None:
        _submit(params, follow=follow)

    command.__name__ = name
    command.__doc__ = doc
    return command


submit = _variant("submit", SUBMIT_HELP, follow=False)
run = _variant("run", RUN_HELP, follow=True)


def queue(  # noqa: PLR0917 - typer options
    user: Annotated[str | None, typer.Option("-u", "--user", help="only this user's jobs")] = None,
    account: Annotated[str | None, typer.Option("-A", "--account", help="only this tenant")] = None,
    pool: Annotated[str | None, typer.Option("-p", "--pool", help="only this pool")] = None,
    states: Annotated[
        list[str] | None, typer.Option("-t", "--states", help="states (names or codes, repeat)")
    ] = None,
    me: Annotated[bool, typer.Option("--me", help="only my jobs")] = False,
    array: Annotated[
        str | None, typer.Option("-a", "--array", help="only the tasks of this job array")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List queued and running jobs (like squeue), with GPU slice, REASON and START estimate.

    Examples:

      gpupool queue

      gpupool queue --me -t PD

      gpupool queue -p research --json
    """
    with session(server, token) as gp:
        if me:
            user = gp.whoami().user
        wanted = states or ACTIVE
        jobs = gp.list(state=wanted, user=user, tenant=account, pool=pool, array=array)
        jobs.sort(key=_queue_order)
        if json_out:
            print_json(jobs)
            return
        emit(render.queue_table(jobs, SystemClock().now()))


def _queue_order(j: JobView) -> tuple[int, float, str]:
    return (0 if j.state != "PENDING" else 1, j.submit_time, j.id)


def install(app: typer.Typer) -> None:
    for command in (submit, run, queue):
        app.command(
            name=command.__name__,
            context_settings={"allow_interspersed_args": command not in (submit, run)},
        )(command)
