"""The kubelet plugin's gRPC services on their unix sockets, as the kubelet calls them.

Two sockets, as Kubernetes' own helper library (``k8s.io/dynamic-resource-allocation/
kubeletplugin``) lays them out:

- the **registration** socket in the kubelet's plugin registry folder
  (``/var/lib/kubelet/plugins_registry/gpu.gpupool.io-reg.sock``): the kubelet's plugin watcher
  sees it appear and calls ``pluginregistration.Registration/GetInfo`` (type ``DRAPlugin``, the
  driver name, the DRA socket's path, the services offered: ``v1.DRAPlugin`` and
  ``v1.DRAResourceHealth``), then ``NotifyRegistrationStatus``;
- the **DRA** socket (``/var/lib/kubelet/plugins/gpu.gpupool.io/dra.sock``) with
  ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` (``NodePrepareResources``,
  ``NodeUnprepareResources``) and ``v1.DRAResourceHealth/NodeWatchResources`` (a stream).

Why a Python servicer and not the Go helper: the work behind each call (the shim region, the
CDI spec, the GPU backend, the health rules) is gpupool's Python; the helper would put a second
process and a second language between the kubelet and that work for four small messages. The
messages are generated from the kubelet's published protos (``scripts/k8s-protos.sh``); the
service wiring is these few lines of ``grpc`` generic handlers, typed, with no generated stubs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpupool.domain.errors import GpupoolError
from gpupool.kube.claims import ClaimError
from gpupool.kube.health import HealthBoard
from gpupool.kube.plugin import ClaimPreparer
from gpupool.kube.proto import dra_v1_pb2 as dra
from gpupool.kube.proto import drahealth_v1_pb2 as health
from gpupool.kube.proto import registration_v1_pb2 as reg
from gpupool.kube.slices import DRIVER

log = logging.getLogger(__name__)

DRA_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
HEALTH_SERVICE = "v1.DRAResourceHealth"
REGISTRATION_SERVICE = "pluginregistration.Registration"
#: What GetInfo's ``supported_versions`` lists (the kubelet picks the services from it).
SUPPORTED = ("v1.DRAPlugin", "v1.DRAResourceHealth")
#: The longest unix socket path (``sun_path`` holds 108 bytes with its terminating NUL).
SOCKET_PATH_MAX = 107
#: How often the health stream re-sends the board when nothing changed (a liveness beat).
HEALTH_RESEND_S = 30.0


class PluginError(GpupoolError):
    """The plugin cannot serve (a socket it cannot bind); the message says what to change."""


@dataclass(frozen=True)
class PluginSockets:
    """Where the plugin listens. ``registry`` ``None``: no registration (tests call it
    directly)."""

    dra: Path
    registry: Path | None


def _unary(fn: Any, request: Any, response: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=request.FromString, response_serializer=response.SerializeToString
    )


class DraService:
    """``NodePrepareResources`` / ``NodeUnprepareResources`` and the health stream."""

    def __init__(self, preparer: ClaimPreparer, board: HealthBoard) -> None:
        self.preparer = preparer
        self.board = board
        self.stopping = threading.Event()

    def prepare(
        self, request: dra.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodePrepareResourcesResponse:
        answer = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            try:
                done = self.preparer.prepare(claim.namespace, claim.name, claim.uid)
            except ClaimError as exc:
                answer.claims[claim.uid].error = str(exc)
                continue
            for i, device in enumerate(done.devices):
                entry = answer.claims[claim.uid].devices.add()
                entry.request_names.append(device.request)
                entry.pool_name = device.pool
                entry.device_name = device.device
                if i == 0:  # one CDI device carries the whole claim's region
                    entry.cdi_device_ids.append(done.cdi_id)
                if device.share_id:
                    entry.share_id = device.share_id
        return answer

    def unprepare(
        self, request: dra.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodeUnprepareResourcesResponse:
        answer = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            try:
                self.preparer.unprepare(claim.uid)
                answer.claims[claim.uid].error = ""
            except OSError as exc:
                answer.claims[claim.uid].error = f"cannot unprepare: {exc}"
        return answer

    def watch(
        self, request: health.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[health.NodeWatchResourcesResponse]:
        seen = -1
        while context.is_active() and not self.stopping.is_set():
            version, states = self.board.snapshot()
            if version != seen:
                seen = version
                answer = health.NodeWatchResourcesResponse()
                for state in states:
                    item = answer.devices.add()
                    item.device.pool_name = self.preparer.node
                    item.device.device_name = state.device
                    item.health = (
                        health.UNKNOWN
                        if state.healthy is None
                        else health.HEALTHY
                        if state.healthy
                        else health.UNHEALTHY
                    )
                    item.last_updated_time = state.since
                    item.health_check_timeout_seconds = int(HEALTH_RESEND_S * 3)
                    item.message = state.message
                yield answer
            if not self.board.wait_change(seen, HEALTH_RESEND_S, self.stopping):
                seen = -1  # resend the same board as a beat (or stop, at the loop's test)

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        dra_handlers = {
            "NodePrepareResources": _unary(
                self.prepare, dra.NodePrepareResourcesRequest, dra.NodePrepareResourcesResponse
            ),
            "NodeUnprepareResources": _unary(
                self.unprepare,
                dra.NodeUnprepareResourcesRequest,
                dra.NodeUnprepareResourcesResponse,
            ),
        }
        health_handlers = {
            "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                self.watch,
                request_deserializer=health.NodeWatchResourcesRequest.FromString,
                response_serializer=health.NodeWatchResourcesResponse.SerializeToString,
            )
        }
        return [
            grpc.method_handlers_generic_handler(DRA_SERVICE, dra_handlers),
            grpc.method_handlers_generic_handler(HEALTH_SERVICE, health_handlers),
        ]


class RegistrationService:
    """What the kubelet's plugin watcher asks on the registration socket."""

    def __init__(self, endpoint: Path, driver: str = DRIVER) -> None:
        self.endpoint = endpoint
        self.driver = driver
        self.registered = threading.Event()
        self.error: str | None = None

    def get_info(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED),
        )

    def notify(
        self, request: reg.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            self.error = None
            self.registered.set()
            log.info("the kubelet registered the %s plugin", self.driver)
        else:
            self.error = request.error
            log.error("the kubelet refused the %s plugin: %s", self.driver, request.error)
        return reg.RegistrationStatusResponse()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        return [
            grpc.method_handlers_generic_handler(
                REGISTRATION_SERVICE,
                {
                    "GetInfo": _unary(self.get_info, reg.InfoRequest, reg.PluginInfo),
                    "NotifyRegistrationStatus": _unary(
                        self.notify, reg.RegistrationStatus, reg.RegistrationStatusResponse
                    ),
                },
            )
        ]


class KubeletPlugin:
    """Both servers, started and stopped together. The DRA socket is served first, so the
    kubelet never learns of an endpoint that does not answer yet."""

    def __init__(self, preparer: ClaimPreparer, board: HealthBoard, sockets: PluginSockets) -> None:
        self.sockets = sockets
        self.dra = DraService(preparer, board)
        self.registration = RegistrationService(sockets.dra, preparer.driver)
        self._servers: list[grpc.Server] = []

    def start(self) -> None:
        self._servers.append(self._serve(self.sockets.dra, self.dra.handlers()))
        if self.sockets.registry is not None:
            self._servers.append(self._serve(self.sockets.registry, self.registration.handlers()))

    @staticmethod
    def _serve(socket: Path, handlers: list[grpc.GenericRpcHandler]) -> grpc.Server:
        if len(str(socket).encode()) > SOCKET_PATH_MAX:
            raise PluginError(
                f"socket path {socket} is longer than a unix socket allows ({SOCKET_PATH_MAX} "
                "bytes): give a shorter --kubelet-dir"
            )
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)  # a previous run's socket
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        for handler in handlers:
            server.add_generic_rpc_handlers((handler,))
        try:
            server.add_insecure_port(f"unix://{socket}")
        except RuntimeError as exc:
            raise PluginError(f"cannot listen on {socket}: {exc}") from exc
        server.start()
        return server

    def stop(self, grace_s: float = 5.0) -> None:
        self.dra.stopping.set()
        self.dra.board.wake()  # health streams end now, not at their next beat
        # The registration socket first: the kubelet then stops calling.
        for server in reversed(self._servers):
            server.stop(grace_s).wait()
        for socket in (self.sockets.registry, self.sockets.dra):
            if socket is not None:
                socket.unlink(missing_ok=True)
        self._servers.clear()


def registration_info(socket: Path, *, timeout_s: float = 10.0) -> str:
    """The driver name a registration socket answers ``GetInfo`` with, as the kubelet asks it
    (``gpupool precheck --kubernetes``)."""
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            get_info = channel.unary_unary(
                f"/{REGISTRATION_SERVICE}/GetInfo",
                request_serializer=reg.InfoRequest.SerializeToString,
                response_deserializer=reg.PluginInfo.FromString,
            )
            info = get_info(reg.InfoRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        raise PluginError(f"{socket} does not answer the kubelet's GetInfo: {exc}") from exc
    return str(info.name)
