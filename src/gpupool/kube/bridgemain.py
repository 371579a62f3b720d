"""``python -m gpupool.kube bridge``: the bridge's process (a Deployment beside the server).

It needs the Kubernetes API (``--kubeconfig``, ``$KUBECONFIG`` or the pod's service account:
list pods and ResourceSlices, bind and evict pods, patch pod status, write ResourceClaim
status, create Events) and two gpupool tokens: ``--token-file`` of an admin (submits to any
namespace's tenant, cancels, makes a tenant for a new namespace) and ``--agent-token-file`` of
an ``agent`` user (registers and heartbeats the Kubernetes nodes). Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from gpupool.client.sdk import Client
from gpupool.domain.errors import GpupoolError
from gpupool.domain.pools import DEFAULT_POOL
from gpupool.kube.bridge import Bridge
from gpupool.kube.client import KubeClient, KubeConfig
from gpupool.kube.podnodes import PodNodes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpupool.kube bridge", description=__doc__)
    p.add_argument("--server", default=os.environ.get("GPUPOOL_SERVER"), help="gpupool's URL")
    p.add_argument("--token-file", type=Path, required=True, help="a token of an admin of gpupool")
    p.add_argument("--agent-token-file", type=Path, required=True,
                   help="a token of a gpupool user with role agent")  # fmt: skip
    p.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG or the pod's account")
    p.add_argument("--pool", default=DEFAULT_POOL, help="the pool (in gpupool) the nodes join")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between cycles")
    return p


def _read(path: Path, what: str) -> str:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise GpupoolError(f"cannot read {what} {path}: {exc}") from exc
    if not text:
        raise GpupoolError(f"{what} {path} is empty: write the token into it")
    return text


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per call otherwise
    if not args.server:
        print("error: give --server URL or set GPUPOOL_SERVER", file=sys.stderr)
        return 2
    try:
        kube = KubeClient(KubeConfig.load(args.kubeconfig))
        gpupool = Client(args.server, _read(args.token_file, "--token-file"))
        agent_token = _read(args.agent_token_file, "--agent-token-file")
    except GpupoolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    nodes = PodNodes(kube, args.server, agent_token, pool=args.pool)
    bridge = Bridge(kube, gpupool, nodes)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    logging.getLogger("gpupool.kube").info("gpupool bridge: pods of schedulerName gpupool")
    try:
        bridge.run(stop, interval_s=args.interval)
    finally:
        nodes.close()
        gpupool.close()
        kube.close()
    return 0
