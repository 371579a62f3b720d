"""The agents' hot calls' short way through the API: answered before FastAPI's routing.

A fleet's heartbeats are mostly quiet (nothing new since the last one: see
``control/machinery/settled.py``) and answered from memory on the event loop; what such a
heartbeat still cost was the web framework around it: matching the path against every route,
solving the route's dependencies, validating the body through FastAPI's field machinery, the
exception and exit-stack layers (three quarters of the server's time on the loop for a quiet
200-node fleet; docs/benchmarks.md, "A fleet of agents").

:class:`AgentShortWay` is an ASGI middleware, inside the load shedding and the body limit
(``api/app.py``), that takes two calls when everything about them is plainly fine and answers
them itself. ``POST /v1/agent/heartbeat``, with:

- a JSON body with a declared length of at most ``MAX_QUIET_BODY`` bytes (a quiet or delta
  heartbeat is a few hundred bytes; the full state of a big node goes the long way);
- a bearer token found in the principal cache (``ControlPlane.principals``: the same cache the
  route's ``principal`` dependency reads first), whose principal may act as an agent;
- a body that :class:`~gpupool.schemas.agent.HeartbeatRequest` accepts (parsed as FastAPI does:
  ``json.loads``, then the model's validation);
- and an answer from :meth:`HeartbeatService.quietly` (quiet, or a delta to be sent in full).

Anything else (no or unknown token, a token of another role, a body that does not parse or
validate, a heartbeat with news, any error) goes on to the route unchanged, with the body
bytes already read handed on as they came: the route checks it again and answers the 401, 403
or 422 exactly as before, and applies a heartbeat with news in a worker thread. So no check is
skipped here; only the happy quiet path is shorter. The answer's bytes are the route's
(``HeartbeatResponse`` as JSON, without the delta fields for an agent that sends no ``seq``).

And the long poll, ``GET /v1/agent/nodes/{name}/orders?since=S&timeout=T`` (each node holds
one: a fifth as many calls as heartbeats at the default intervals, each of which cost more than
a quiet heartbeat through the framework), with a cached agent token and a query of at most
those two keys, each once, written plainly (``since`` an integer from -1 to 2**62, ``timeout``
a decimal from 0 to 60): it waits on the order board as the route does
(``ControlPlane.orders.wait``) and answers the route's ``OrdersAnswer``. Any other query (a
bound crossed, ``1e1``, a key twice, an unknown key) goes to the route, which answers it as
before (a 422 that names the parameter, or ignoring an unknown key).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from pydantic import ValidationError

from gpupool.api.clientaddr import Network, address_of
from gpupool.api.deps import Services
from gpupool.control.services.auth import Actor, Principal
from gpupool.domain.errors import GpupoolError
from gpupool.domain.users import Permission
from gpupool.schemas.agent import DELTA_ANSWER_FIELDS, HeartbeatRequest, OrdersAnswer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = "/v1/agent/heartbeat"
#: The long poll's path (``[^/]+``: Starlette's ``{name}``).
ORDERS = re.compile(r"^/v1/agent/nodes/([^/]+)/orders$")
_SINCE = re.compile(rb"^-?[0-9]{1,19}$")
_TIMEOUT = re.compile(rb"^[0-9]{1,3}(\.[0-9]{1,9})?$")
#: The largest body taken the short way (bytes, as declared by ``Content-Length``).
MAX_QUIET_BODY = 64 * 1024
_UNKNOWN = frozenset(DELTA_ANSWER_FIELDS)
#: Set in the scope by a caller below ASGI that already tried the quiet answer and got none
#: (``gpupool.cli.serverhttp``): the middleware then passes the heartbeat on at once.
TRIED = "gpupool.quiet_tried"


def _headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[int | None, bool, str | None]:
    """``(declared length, JSON content type, bearer secret)`` of the request."""
    length: int | None = None
    is_json = False
    secret: str | None = None
    for key, value in headers:
        if key == b"content-length":
            text = value.strip()
            length = int(text) if text.isdigit() and len(text) <= 19 else None
        elif key == b"content-type":
            is_json = value.split(b";", 1)[0].strip().lower() == b"application/json"
        elif key == b"authorization":
            scheme, _, rest = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and rest.strip():
                secret = rest.strip()
    return length, is_json, secret


class AgentShortWay:
    """See the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope.get("path") == PATH and scope.get("method") == "POST" and TRIED not in scope:
            await self._heartbeat(scope, receive, send)
        elif scope.get("method") == "GET" and (found := ORDERS.match(scope.get("path", ""))):
            await self._orders(scope, receive, send, found.group(1))
        else:
            await self.app(scope, receive, send)

    async def _orders(self, scope: Scope, receive: Receive, send: Send, node: str) -> None:
        query = _orders_query(scope.get("query_string", b""))
        svc: Services = scope["app"].state.services
        if query is None or cached_agent(svc, _headers(scope.get("headers", ()))[2]) is None:
            await self.app(scope, receive, send)
            return
        since, timeout = query
        seq = await svc.cp.orders.wait(node, since, timeout)
        await _json(send, OrdersAnswer(seq=seq, changed=seq > since).model_dump_json().encode())

    async def _heartbeat(self, scope: Scope, receive: Receive, send: Send) -> None:
        length, is_json, secret = _headers(scope.get("headers", ()))
        svc: Services = scope["app"].state.services
        who = cached_agent(svc, secret)
        if length is None or length > MAX_QUIET_BODY or not is_json or who is None:
            await self.app(scope, receive, send)
            return
        received: list[Message] = []
        body = b""
        more = True
        while more:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: the route sees it too
            body += message.get("body", b"")
            more = bool(message.get("more_body", False)) and len(body) <= length
        answer = None
        if not more:
            headers = scope.get("headers", ())
            answer = quiet_heartbeat(scope["app"].state, headers, body, scope.get("client"))
        if answer is None:
            await self.app(scope, _replay(received, receive), send)
            return
        await _json(send, answer)


def cached_agent(svc: Services, secret: str | None) -> Principal | None:
    """The caller when its token is in the principal cache and it may act as an agent."""
    if secret is None:
        return None
    who = svc.cp.principals.get(secret, svc.cp.now())
    return who if who is not None and who.can(Permission.AGENT) else None


def quiet_heartbeat(
    state: Any,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    client: tuple[str, int] | None,
) -> bytes | None:
    """The quiet answer's body for a whole ``POST /v1/agent/heartbeat`` (its headers as
    ASGI gives them, lower-case names; ``state`` the app's ``app.state``), or ``None``: let
    the route take it. For callers below ASGI (``gpupool.cli.serverhttp``): the same checks
    as :class:`AgentShortWay`."""
    length, is_json, secret = _headers(headers)
    if length != len(body) or length > MAX_QUIET_BODY or not is_json:
        return None
    svc: Services = state.services
    who = cached_agent(svc, secret)
    if who is None:
        return None
    remote = _remote(state.trusted_proxies, client, headers)
    return _answer(svc, Actor(principal=who, method="POST", path=PATH, remote=remote), body)


def _remote(
    networks: tuple[Network, ...], client: Any, headers: Iterable[tuple[bytes, bytes]]
) -> str | None:
    """The caller's address as ``actor_of`` reads it (``api/clientaddr.py``)."""
    peer = client[0] if client else None
    if not networks:
        return peer  # the default: no proxy named, the peer is the caller
    # The first such header, as Starlette's ``headers.get`` gives ``client_address`` it.
    forwarded = next((v for k, v in headers if k == b"x-forwarded-for"), b"")
    return address_of(peer, networks, forwarded.decode("latin-1"))


def _answer(svc: Services, act: Actor, body: bytes) -> bytes | None:
    """The quiet answer's bytes, or ``None``: let the route take the request."""
    try:
        req = HeartbeatRequest.model_validate(json.loads(body))
    except (ValueError, ValidationError, RecursionError):  # the route answers the 422
        return None
    try:
        answer = svc.heartbeat.quietly(act, req)
    except GpupoolError:
        return None  # the route raises it again, answered as every error is
    if answer is None:
        return None
    unknown = set(_UNKNOWN) if req.seq is None else None
    return answer.model_dump_json(exclude=unknown).encode()


def _orders_query(raw: bytes) -> tuple[int, float] | None:
    """``(since, timeout)`` from a plainly written query (defaults -1 and 25 s, as the
    route's), or ``None``: let the route read it."""
    values: dict[bytes, bytes] = {}
    for part in raw.split(b"&") if raw else ():
        key, eq, value = part.partition(b"=")
        if not eq or key not in (b"since", b"timeout") or key in values:
            return None
        values[key] = value
    since_raw, timeout_raw = values.get(b"since", b"-1"), values.get(b"timeout", b"25")
    if not _SINCE.match(since_raw) or not _TIMEOUT.match(timeout_raw):
        return None
    since, timeout = int(since_raw), float(timeout_raw)
    if not -1 <= since <= 2**62 or not 0 <= timeout <= 60:
        return None
    return since, timeout


async def _json(send: Send, body: bytes) -> None:
    """A ``200`` with a JSON body, as a route's ``Response(..., media_type=...)`` sends it."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-length", str(len(body)).encode()),
                (b"content-type", b"application/json"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _replay(received: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives the messages already read, then reads on."""
    pending = list(received)

    async def again() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return again
