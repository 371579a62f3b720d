"""``python -m gpupool.kube``: gpupool's DRA driver on one node (the DaemonSet's container);
``python -m gpupool.kube bridge``: gpupool's scheduler for pods (:mod:`gpupool.kube.bridge`).

It publishes the node's GPUs as a ResourceSlice (and keeps it current: lost GPUs withdrawn,
unhealthy ones tainted), applies the DeviceClass, and serves the kubelet plugin (prepare,
unprepare, health) on the kubelet's plugin sockets, until SIGTERM. Paths default to the
kubelet's; every one can be moved for a test or an unusual kubelet root.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from gpupool.domain.errors import GpupoolError
from gpupool.gpu import open_backend
from gpupool.kube.client import KubeClient, KubeConfig
from gpupool.kube.grpcapi import KubeletPlugin, PluginSockets
from gpupool.kube.health import HealthBoard
from gpupool.kube.plugin import ClaimPreparer
from gpupool.kube.publisher import FIELD_MANAGER, SlicePublisher
from gpupool.kube.slices import DRIVER, device_class
from gpupool.runtime.shim import RegionError, job_env, real_driver, real_nvml
from gpupool.runtime.shimreserve import ShimReserves

log = logging.getLogger("gpupool.kube")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpupool.kube", description=__doc__)
    p.add_argument("--node", default=os.environ.get("NODE_NAME"), help="this Node's name")
    p.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG or the pod's account")
    p.add_argument("--simulate", help="simulated GPUs, e.g. 2xA100-80GB (tests, demos)")
    p.add_argument("--kubelet-dir", type=Path, default=Path("/var/lib/kubelet"))
    p.add_argument("--cdi-dir", type=Path, default=Path("/var/run/cdi"))
    p.add_argument("--interval", type=float, default=5.0, help="seconds between GPU samples")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bridge"]:
        from gpupool.kube.bridgemain import main as bridge_main

        return bridge_main(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not args.node:
        print("error: give --node NAME or set NODE_NAME (the pod's spec.nodeName)", file=sys.stderr)
        return 2
    try:
        client = KubeClient(KubeConfig.load(args.kubeconfig))
        backend = open_backend(node=args.node, simulate=args.simulate)
    except GpupoolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    board = HealthBoard()
    publisher = SlicePublisher(client, backend, args.node, board=board)
    client.apply(device_class(), field_manager=FIELD_MANAGER)
    plugin_dir = args.kubelet_dir / "plugins" / DRIVER

    def shim_env(region: Path) -> dict[str, str]:
        driver = real_driver()
        if driver is None:
            raise RegionError(
                "no CUDA driver (libcuda.so.1) on this node: install the NVIDIA driver or set "
                "GPUPOOL_REAL_LIBCUDA"
            )
        return job_env(region, driver, real_nvml=real_nvml())

    driver = real_driver()
    reserves = (
        ShimReserves(plugin_dir / "shim-context.json", driver).for_devices(
            d.uuid for d in backend.inventory() if not d.mig_enabled
        )
        if driver is not None and args.simulate is None
        else {}
    )
    preparer = ClaimPreparer(
        client, args.node, backend.inventory(),
        state_dir=plugin_dir, cdi_dir=args.cdi_dir, shim_env=shim_env, context_reserves=reserves,
    )  # fmt: skip
    sockets = PluginSockets(
        dra=plugin_dir / "dra.sock",
        registry=args.kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock",
    )
    plugin = KubeletPlugin(preparer, board, sockets)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        publisher.sync()
        plugin.start()
    except GpupoolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        plugin.stop()
        return 1
    log.info("gpupool DRA driver serving node %s at %s", args.node, sockets.dra)
    try:
        publisher.run(stop, interval_s=args.interval)
    finally:
        plugin.stop()
        backend.close()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
