"""``gpupool agent``: run the node agent of this machine against a server.

Example::

    gpupool agent --server http://pool.lab:8470 --token-file /etc/gpupool/agent-token
    gpupool agent --server http://127.0.0.1:8470 --token-file t --simulate 4xA100-80GB --node sim-1

Its state (job folders, logs, checkpoints by default) lives in ``--state-dir``, by default
``$GPUPOOL_HOME/agent/<node>``. Stopping the agent (Ctrl-C, SIGTERM) leaves jobs running; the
next agent started with the same state folder re-adopts them, if it makes contact with the server
within half the server's node timeout; past that, the replicas stop themselves with the reason
``node`` (the server is about to start them elsewhere; see agent/fence.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpupool.domain.errors import GpupoolError

if TYPE_CHECKING:
    from gpupool.agent.local import LocalAgent
    from gpupool.control.settings import ServerSettings


def gpupool_home() -> Path:
    """``$GPUPOOL_HOME``, by default ``~/.local/share/gpupool``."""
    return Path(os.environ.get("GPUPOOL_HOME") or "~/.local/share/gpupool").expanduser()


def read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise GpupoolError(
            f"cannot read the agent token from {path}: {exc.strerror}; "
            "create a token with role 'agent' and save it there"
        ) from None
    if not token:
        raise GpupoolError(f"the token file {path} is empty: put the agent token in it")
    return token


def jobs_run_as(mode: str, credential: str) -> str:
    """The start-up line that says whose account jobs run as, and what that means."""
    import pwd

    from gpupool.agent.dynuid import FIRST_UID, LAST_UID
    from gpupool.agent.runas import AGENT, AUTO, SUBMITTER, resolve_mode

    if resolve_mode(mode) == AUTO:
        return (
            "jobs run as their submitters' Unix accounts where they have one, else each "
            f"replica as a transient account of its own (UIDs {FIRST_UID}-{LAST_UID}): never "
            "as root or as this process's account, never two tenants in one account"
        )
    if mode == SUBMITTER:
        return "jobs run as their submitters' Unix accounts (--run-as submitter)"
    if mode not in (AGENT, AUTO):
        return (
            f"jobs run as Unix account {mode} (--run-as {mode}), one account for every tenant: "
            "their jobs can read each other's environments, files and uploads and signal each "
            "other; the default (--run-as auto, as root) gives each submitter or replica an "
            "account of its own"
        )
    me = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        return (
            f"jobs run as root (--run-as agent): any job can read {credential} and do "
            "anything on this machine. Only for a machine of one person; the default "
            "(--run-as auto) runs each job as its submitter's or a transient account"
        )
    own = "this is your own pool: " if mode == AUTO else ""
    return (
        f"{own}jobs run as {me}, this process's own account: any job can read {credential}. "
        "Fine for a pool of one person; with more users start it as root (each job then runs "
        "as its submitter's or a transient account of its own; see docs/security.md)"
    )


#: The environment variable that gives ``--run-as`` (an operator's service file may set it).
RUN_AS_ENV = "GPUPOOL_RUN_AS"
RUN_AS_HELP = (
    "whose Unix account jobs run as: 'auto' (as root: the submitter's account where one "
    "exists, else a transient per-replica UID; as another user: yours), 'agent' (this "
    "process's: one-person machines only, a job can read the tokens), 'submitter', or an "
    "account's name (one account shared by every tenant)"
)


def start_local_agent(
    settings: ServerSettings, simulate: str | None, run_as: str = "auto"
) -> LocalAgent:
    """Start ``gpupool up``'s local agent beside the server being started with ``settings``."""
    from gpupool.agent.local import LocalAgent

    logging.getLogger("httpx").setLevel(logging.WARNING)
    local = LocalAgent(
        home=settings.home,
        url=f"http://127.0.0.1:{settings.port}",
        admin_token_path=settings.admin_token_path,
        simulate=simulate,
        announce=typer.echo,
        run_as=run_as,
    )
    local.start()
    return local


def run_agent(  # noqa: PLR0917 - typer options
    server: list[str] = typer.Option(  # noqa: B008
        ...,
        envvar="GPUPOOL_SERVERS",
        help="URL of the gpupool server, e.g. http://host:8470; repeat it (or separate with "
        "commas) for each server replica: the agent starts at a random one and moves to the "
        "next when one does not answer",
    ),
    token_file: Path = typer.Option(..., help="file holding a token with role 'agent'"),  # noqa: B008
    node: str | None = typer.Option(None, help="node name (default: the host name)"),
    state_dir: Path | None = typer.Option(  # noqa: B008
        None, help="agent state folder (default: $GPUPOOL_HOME/agent/<node>)"
    ),
    simulate: str | None = typer.Option(
        None, help="use simulated GPUs: a spec like 4xA100-80GB,2xT4 or a YAML file"
    ),
    seed: int = typer.Option(0, help="seed of simulated telemetry"),
    address: str | None = typer.Option(None, help="address other nodes reach this one at"),
    pool: str | None = typer.Option(None, help="pool for this node's devices when it is new"),
    checkpoint_root: Path | None = typer.Option(  # noqa: B008
        None, help="where job checkpoint folders go (share it between nodes to move jobs)"
    ),
    log_cap: str = typer.Option("64MiB", help="size cap of each job's stdout and stderr log"),
    run_as: str = typer.Option("auto", envvar=RUN_AS_ENV, help=RUN_AS_HELP),
    feature: list[str] | None = typer.Option(  # noqa: B008
        None,
        "--feature",
        envvar="GPUPOOL_AGENT_FEATURES",
        help="node features for --constraint: ib,a100x8 (repeat or comma-separate)",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log more"),
) -> None:
    """Run this machine's node agent: report its GPUs and run the jobs placed on them.

    Example: ``gpupool agent --server http://head:8470 --token-file /etc/gpupool/agent-token``
    (with replicas: ``--server http://head1:8470 --server http://head2:8470``, or
    ``GPUPOOL_SERVERS="http://head1:8470 http://head2:8470"``)
    """
    from gpupool.agent.agent import Agent
    from gpupool.agent.config import AgentConfig
    from gpupool.agent.node import default_node_name
    from gpupool.agent.runas import check_mode, check_token_file, protect_state
    from gpupool.agent.transport import AgentRejected, HttpTransport, server_urls
    from gpupool.control.machinery.clock import SystemClock
    from gpupool.domain.interactive import parse_features
    from gpupool.domain.units import mib_to_bytes, parse_memory
    from gpupool.gpu import open_backend

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)
    try:
        servers = server_urls(server)
        name = node or default_node_name()
        token = read_token(token_file)
        cap = mib_to_bytes(parse_memory(log_cap, field="log-cap"))
        features = parse_features(",".join(feature or ()))
        backend = open_backend(node=name, simulate=simulate, seed=seed)
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    folder = state_dir or gpupool_home() / "agent" / name
    folder.mkdir(parents=True, exist_ok=True)
    config = AgentConfig(
        node=name,
        state_dir=folder,
        address=address,
        checkpoint_root=checkpoint_root,
        pool=pool,
        log_cap_bytes=cap,
        run_as=run_as,
        features=list(features),
    )
    reachable = [folder / "work", checkpoint_root or folder / "checkpoints"]
    try:
        check_mode(run_as, [])
        protect_state(run_as, folder, reachable)
        check_mode(run_as, reachable)
        check_token_file(run_as, token_file)
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    agent = Agent(config, backend, HttpTransport(servers, token), SystemClock())
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    kinds = sorted({d.name for d in agent.inventory})
    typer.echo(
        f"gpupool agent: node {name}, {len(agent.devices)} {backend.name} GPU(s) "
        f"({', '.join(kinds)}), server {', '.join(servers)}, state in {folder}"
    )
    typer.echo(jobs_run_as(run_as, f"this node's agent token ({token_file})"))
    try:
        agent.run(stop)
    except AgentRejected as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        agent.close()
    counts = agent.summary()
    live = counts.get("running", 0) + counts.get("starting", 0)
    typer.echo(
        f"gpupool agent stopped; {live} replica(s) keep running and are re-adopted by an agent "
        "back within half the server's node timeout (they stop themselves after that)"
    )
    sys.stdout.flush()


def install(app: typer.Typer) -> None:
    app.command(name="agent")(run_agent)
