"""The hot verbs' one implementation: ``submit`` (and ``run``'s submit), ``queue``, ``cancel``
(and ``hold``/``release``'s selection), ``show``.

Each function takes the ``params`` dict of :mod:`gpupool.cli.options` (from the fast parser or
from typer: the same dict) and talks to the server through :class:`~gpupool.client.wire.Wire`
(plain JSON), so the everyday case imports neither httpx, pydantic, rich nor typer. What only
the heavy tools can do is imported where it is needed, and only then: ``--json`` (the wire
models' exact JSON, through pydantic), ``--workdir`` (the SDK's packing and upload),
``run``'s output stream (the SDK), a table or ``show`` page only rich can lay out. Errors
leave as :class:`SystemExit` with the words and exit codes of :mod:`gpupool.cli.session`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from gpupool.cli.out import echo, fail, handle_errors, print_json
from gpupool.client.errors import EXIT_CONFLICT, EXIT_DENIED, EXIT_NOT_FOUND, ServerUnreachable
from gpupool.client.wire import Wire
from gpupool.domain.states import ACTIVE_STATES, JobState

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from types import FrameType
    from typing import Any

    from gpupool.schemas.jobs import JobView

#: The most jobs the server answers in one page of ``GET /v1/jobs`` (the SDK's PAGE_SIZE).
PAGE_SIZE = 1000

#: What ``queue`` lists without ``-t``: every job not yet ended.
ACTIVE = [s.value for s in (JobState.PENDING, JobState.REQUEUED, *sorted(ACTIVE_STATES, key=str))]


def _wire(params: dict[str, Any]) -> Wire:
    return Wire(params.get("server"), params.get("token"))


def _as_json(model: str, data: Any) -> Any:
    """``data`` (an API answer) as ``--json`` prints it: through the wire model ``model`` of
    :mod:`gpupool.schemas.jobs`, so the fields and their order are the SDK's exactly."""
    from gpupool.schemas import jobs
    from gpupool.schemas.base import read_answer

    cls = getattr(jobs, model)
    if isinstance(data, list):
        return [read_answer(cls, d).model_dump(mode="json") for d in data]
    return read_answer(cls, data).model_dump(mode="json")


# ------------------------------------------------------------------ submit (sbatch)


def _post_submit(wire: Wire, payload: dict[str, Any], retries: int = 2) -> dict[str, Any]:
    """``POST /v1/jobs``, retried with the same idempotency key when the server cannot be
    reached (the server then answers the job a lost first attempt made, never a second)."""
    for attempt in range(retries + 1):
        try:
            answer: dict[str, Any] = wire.call("POST", "/v1/jobs", body=payload)
        except ServerUnreachable:
            if attempt == retries:
                raise
            time.sleep(0.5 * 2**attempt)
            continue
        return answer
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def submit(params: dict[str, Any], *, follow: bool = False) -> None:
    """``gpupool submit`` (``follow``: ``gpupool run``, which then streams the job's output)."""
    from gpupool.cli.submitspec import build_submission
    from gpupool.domain.arrays import parse_array
    from gpupool.domain.dependency import parse_begin

    json_out, parsable = params["json_out"], params["parsable"]
    array: str | None = params["array"]
    if array is not None and follow:
        raise fail("--array submits many jobs: use gpupool submit --array, then gpupool queue")
    want_pty = bool(params.get("pty"))
    if want_pty and not follow:
        raise fail("--pty gives a job your terminal: use gpupool run --pty, e.g. run --pty bash")
    with handle_errors(cli_options=True):
        spec = build_submission(params)
        if array is not None:
            parse_array(array)  # refused here, before anything is uploaded
        begin_text: str | None = params.get("begin")
        begin = None if begin_text is None else parse_begin(begin_text, time.time())
    # run: from its submit on, a Ctrl-C or SIGTERM cancels the job (_cancel_if_stopped)
    stopper = contextlib.ExitStack()
    with stopper:
        with handle_errors():
            wire = _wire(params)
            if want_pty:
                from gpupool.cli import ptyrun  # only a terminal pays for termios and sockets

                listener, endpoint = ptyrun.listen(wire.server)
                spec["pty"] = endpoint  # checked again by the server, as the whole spec
            payload: dict[str, Any] = {
                "spec": spec,
                "idempotency_key": f"sdk-{os.urandom(12).hex()}",
            }
            if params["workdir"] is not None:
                from gpupool.client.sdk import Client

                with Client(params.get("server"), params.get("token")) as gp:
                    payload["workdir_upload"] = gp.upload_workdir(params["workdir"])
            for key in ("hold", "queue_anyway"):
                if params[key]:
                    payload[key] = True
            if begin is not None:
                payload["begin"] = begin
            if array is not None:
                payload["array"] = array
            answer = _post_submit(wire, payload)
            job: dict[str, Any] = answer["job"]
            if follow:  # from here on a Ctrl-C or SIGTERM cancels the job
                stopper.enter_context(_cancel_if_stopped(wire, job["id"]))
            if array is not None:
                tasks: list[dict[str, Any]] = answer["array"]
                if parsable:
                    echo("\n".join(t["id"] for t in tasks))
                elif json_out:
                    print_json(_as_json("JobView", tasks))
                else:
                    echo(
                        f"Submitted array {tasks[0]['array_id']} of {len(tasks)} jobs "
                        f"({tasks[0]['name']} .. {tasks[-1]['name']}) to pool {tasks[0]['pool']}"
                    )
                return
            if parsable:
                echo(job["id"])
            elif json_out and not follow:
                print_json(_as_json("JobView", job))
            else:
                echo(f"Submitted job {job['id']} ({job['name']}) to pool {job['pool']}", err=follow)
        if not follow:
            return
        if want_pty:
            from gpupool.cli.jobs import follow_pty

            code = follow_pty(params, job["id"], listener, endpoint["key"])
        else:
            from gpupool.cli.jobs import follow_job

            code = follow_job(params, job["id"])
        raise SystemExit(code)


class _Stopped(Exception):
    """SIGTERM reached ``gpupool run`` before its stream took over the signal."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stopped


@contextlib.contextmanager
def _cancel_if_stopped(wire: Wire, job_id: str) -> Iterator[None]:
    """``run`` from its submit to its stream (printing, importing the SDK, opening its session:
    seconds on a loaded machine): a Ctrl-C or SIGTERM there cancels the job and exits 130 or
    143, as one during the stream does (:func:`gpupool.cli.jobs._follow`, which takes the
    signal over while it streams), instead of leaving the job running behind a ``run`` that
    is gone."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    except (KeyboardInterrupt, _Stopped) as exc:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one cancel, even if more come
        what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        with handle_errors():
            wire.call(
                "POST",
                f"/v1/jobs/{job_id}/cancel",
                body={"reason": f"interrupted: {what} on gpupool run"},
            )
        echo(f"\ncancelled job {job_id}", err=True)
        raise SystemExit(
            130 if isinstance(exc, KeyboardInterrupt) else 128 + signal.SIGTERM
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------ queue (squeue)


def list_jobs(wire: Wire, query: Sequence[tuple[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every job ``GET /v1/jobs`` answers for ``query``, page after page to the last."""
    cursor: str | None = None
    while True:
        page: dict[str, Any] = wire.call(
            "GET",
            "/v1/jobs",
            query=[("limit", PAGE_SIZE), *query, *([("cursor", cursor)] if cursor else [])],
        )
        yield from page["jobs"]
        cursor = page.get("next_cursor")
        if cursor is None:
            return


def queue(params: dict[str, Any]) -> None:
    """``gpupool queue``: the jobs not yet ended (or ``-t``), running first, as squeue."""
    from gpupool.cli.jobtable import queue_order, queue_table, rows
    from gpupool.cli.out import emit_table

    with handle_errors():
        wire = _wire(params)
        user = params["user"]
        if params["me"]:
            user = wire.call("GET", "/v1/whoami")["user"]
        query: list[tuple[str, Any]] = [("state", s) for s in params["states"] or ACTIVE]
        filters = (
            ("tenant", params["account"]),
            ("user", user),
            ("pool", params["pool"]),
            ("array", params["array"]),
        )
        query += [(k, v) for k, v in filters if v is not None]
        found = list(list_jobs(wire, query))
        if params["json_out"]:
            jobs = _as_json("JobView", found)
            jobs.sort(
                key=lambda j: (0 if j["state"] != "PENDING" else 1, j["submit_time"], j["id"])
            )
            print_json(jobs)
            return
        listed = rows(found)
        listed.sort(key=queue_order)
        emit_table(queue_table(listed, time.time()))


# ------------------------------------------------------------------ cancel, hold, release

#: What each action says about a job named by id that it leaves alone.
_SKIP = {
    "cancel": "already ended: nothing to cancel",
    "hold": "only pending jobs can be held",
}


def select(action: str, params: dict[str, Any]) -> None:
    """``action`` on every job the ids and filters of ``params`` select, in one request
    (``POST /v1/jobs/bulk``); one line per job changed, then the ids that matched nothing
    (exit 3) or that the action leaves alone (exit 6)."""
    body = {
        "action": action,
        "ids": list(params.get("job_ids") or ()),
        "user": params.get("user"),
        "name": params.get("name"),
        "states": list(params.get("state") or ()),
        "array": params.get("array"),
        "tenant": params.get("account"),
        "pool": params.get("pool"),
        "reason": params.get("reason"),
    }
    with handle_errors():
        done: dict[str, Any] = _wire(params).call("POST", "/v1/jobs/bulk", body=body)
    changed: list[dict[str, Any]] = done["changed"]
    if params["json_out"]:
        print_json(_as_json("BulkJobChange", changed))
    elif changed:
        echo(
            "\n".join(
                f"job {c['id']} ({c['name']}): {c['state']}"
                + (", held" if c["held"] and c["state"] == "PENDING" else "")
                for c in changed
            )
        )
    code = 0
    for c in done["skipped"]:
        if action in _SKIP:
            echo(f"error: job {c['id']} is {c['state']}: {_SKIP[action]}", err=True)
            code = EXIT_CONFLICT
    for job_id in done["not_found"]:
        echo(f"error: job {job_id!r} not found: list your jobs with `gpupool queue`", err=True)
        code = EXIT_NOT_FOUND
    if done["refused"]:
        echo(
            f"error: {done['refused']} selected job(s) are not yours to {action}: members change "
            "their own jobs, tenant admins their tenant's",
            err=True,
        )
        code = code or EXIT_DENIED
    if not changed and not code and not params["json_out"]:
        echo(f"no job matched: nothing to {action}", err=True)
    if code:
        raise SystemExit(code)


def cancel(params: dict[str, Any]) -> None:
    """``gpupool cancel``: by ids and/or filters, in one request (like scancel)."""
    filters = ("user", "name", "state", "array", "account", "pool")
    if not params["job_ids"] and not any(params[f] for f in filters):
        raise fail("nothing to cancel: give job ids, or a filter (-u, -n, -t, -a, -A, -p)")
    select("cancel", params)


# ------------------------------------------------------------------ show (scontrol show job)


def _tasks(wire: Wire, array_id: str) -> list[JobView]:
    from gpupool.cli.jobtable import rows

    found = rows(list(list_jobs(wire, [("array", array_id)])))
    return sorted(found, key=lambda t: t.array_index or 0)


def show(params: dict[str, Any]) -> None:
    """``gpupool show``: one job's fields, why it waits, its priority factors and events; a
    job array's id: its tasks, as ``queue`` lists them."""
    from gpupool.cli.jobref import resolve_with
    from gpupool.cli.jobtable import data_of, detail_text, queue_table, rows
    from gpupool.cli.out import emit_table, terminal_width

    job_id: str = params["job_id"]
    with handle_errors():
        wire = _wire(params)
        found = resolve_with(
            lambda ref: rows([wire.call("GET", f"/v1/jobs/{ref}")])[0],
            lambda array_id: _tasks(wire, array_id),
            job_id,
        )
        now = time.time()
        if isinstance(found, list):
            if params["json_out"]:
                print_json(_as_json("JobView", [data_of(t) for t in found]))
                return
            echo(f"job array {job_id}: {len(found)} tasks (gpupool show {job_id}_INDEX for one)")
            emit_table(queue_table(found, now))
            return
        events: list[dict[str, Any]] = wire.call("GET", f"/v1/jobs/{found.id}/events")
    if params["json_out"]:
        print_json(
            {
                "job": _as_json("JobView", data_of(found)),
                "events": _as_json("JobEventView", events),
            }
        )
        return
    tty = sys.stdout.isatty()
    width = terminal_width() if tty else 400
    text = detail_text(found, rows(events), now, width)
    if text is None or (tty and os.environ.get("TERM") == "dumb"):
        from gpupool.cli import render
        from gpupool.cli.session import emit
        from gpupool.schemas.base import read_answer, read_answers
        from gpupool.schemas.jobs import JobEventView
        from gpupool.schemas.jobs import JobView as Job

        job = read_answer(Job, data_of(found))
        emit(render.job_detail(job, read_answers(JobEventView, events), now))
        return
    sys.stdout.write(text)
