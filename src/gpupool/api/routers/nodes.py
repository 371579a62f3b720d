"""``/v1/nodes`` and ``/v1/devices``: inventory, draining, deleting a down node, moving devices
between pools."""

from __future__ import annotations

from fastapi import APIRouter

from gpupool.api.deps import Act, Svc, Who
from gpupool.api.views import device_view, node_view
from gpupool.control.errors import Invalid
from gpupool.domain.nodes import NodeState
from gpupool.schemas.nodes import DeviceView, MoveDeviceRequest, NodeView, SetNodeStateRequest

router = APIRouter(tags=["nodes"])


@router.get("/v1/nodes", response_model=list[NodeView])
def list_nodes(svc: Svc, who: Who) -> list[NodeView]:
    return [node_view(n) for n in svc.nodes.list_nodes(who)]


@router.get("/v1/nodes/{name}", response_model=NodeView)
def get_node(name: str, svc: Svc, who: Who) -> NodeView:
    return node_view(svc.nodes.get(who, name))


@router.post("/v1/nodes/{name}/state", response_model=NodeView)
def set_node_state(name: str, body: SetNodeStateRequest, svc: Svc, act: Act) -> NodeView:
    try:
        state = NodeState(body.state)
    except ValueError:
        raise Invalid(f"node state {body.state!r} is not valid: use 'up' or 'draining'") from None
    svc.nodes.set_state(act, name, state)
    return node_view(svc.nodes.get(act.principal, name))


@router.delete("/v1/nodes/{name}", status_code=204)
def delete_node(name: str, svc: Svc, act: Act) -> None:
    """Remove a node that is down and holds no assignment (409 otherwise, saying what to do)."""
    svc.nodes.delete(act, name)


@router.get("/v1/devices", response_model=list[DeviceView])
def list_devices(svc: Svc, who: Who) -> list[DeviceView]:
    return [
        device_view(d, n.slices.get(d.uuid, ()), n.samples.get(d.uuid))
        for n in svc.nodes.list_nodes(who)
        for d in n.devices
    ]


@router.post("/v1/devices/{uuid}/pool", status_code=204)
def move_device(uuid: str, body: MoveDeviceRequest, svc: Svc, act: Act) -> None:
    svc.pools.move_device(act, uuid, body.pool)
