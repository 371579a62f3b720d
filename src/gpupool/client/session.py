"""The SDK's connection to one gpupool server: :class:`Session`.

A session holds one ``httpx.Client`` (connection reuse) with the bearer token of the discovery
chain (:mod:`gpupool.client.config`), and sends every call of the SDK through
:meth:`Session.request`, which maps what can go wrong to the SDK's errors: an error answer to
:class:`~gpupool.client.errors.ApiError` with the server's problem+json ``detail``, a server
that cannot be reached or does not answer in time to
:class:`~gpupool.client.errors.ServerUnreachable`, a missing token to
:class:`~gpupool.client.errors.ConfigError` before anything is sent. :meth:`Session._get` and
:meth:`Session._get_list` read an answer into the wire models of :mod:`gpupool.schemas`.

The calls themselves are mixins over it, joined in :class:`gpupool.client.sdk.Client`.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from gpupool import __version__
from gpupool.client.config import Resolved, gpupool_home, resolve
from gpupool.client.errors import ApiError, ConfigError, ServerUnreachable
from gpupool.domain.clock import Clock, SystemClock
from gpupool.schemas.base import read_answer, read_answers

M = TypeVar("M", bound=BaseModel)
S = TypeVar("S", bound="Session")


def _problem(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    detail = body.get("detail") or response.text.strip()[:300] or response.reason_phrase
    return ApiError(response.status_code, str(body.get("title") or "error"), str(detail))


class Session:
    """A connection to one gpupool server (see the module docstring).

    ``server`` / ``token`` default to the discovery chain of :mod:`gpupool.client.config`.
    ``home`` is where a local pool keeps its files (``$GPUPOOL_HOME``), used to read logs of jobs
    run by this machine's agent. ``transport`` is for tests (``httpx.MockTransport``).
    """

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 15.0,
        clock: Clock | None = None,
        home: Path | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.resolved: Resolved = resolve(server, token)
        self.server = self.resolved.server
        self.clock: Clock = clock or SystemClock()
        self.home = home or gpupool_home()
        headers = {"User-Agent": f"gpupool-client/{__version__}"}
        if self.resolved.token:
            headers["Authorization"] = f"Bearer {self.resolved.token}"
        # A plain-HTTP server needs no TLS: not building the certificate store saves every
        # command about 50 ms of CPU (redirects are not followed, so no request leaves the
        # base URL); an https:// server is verified as always.
        tls = not self.server.startswith("http://")
        self._http = httpx.Client(
            base_url=self.server,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            verify=tls,
        )

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._http.close()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        """Send one request; raise :class:`ApiError` for an error answer."""
        if not self.resolved.token and path.startswith("/v1/") and path != "/v1/version":
            raise ConfigError(
                f"no API token for {self.server}: pass --token, set GPUPOOL_TOKEN, or run "
                "gpupool login"
            )
        try:
            query: list[tuple[str, Any]] | None = None
            if params is not None:
                query = list(params.items()) if isinstance(params, Mapping) else list(params)
            response = self._http.request(
                method, path, json=json, params=query, headers=headers, content=content
            )
        except httpx.TimeoutException:
            raise ServerUnreachable(
                f"{self.server} did not answer in time: check the server is up, or retry"
            ) from None
        except httpx.TransportError as exc:
            raise ServerUnreachable(
                f"cannot reach {self.server} ({type(exc).__name__}): start it with gpupool up, "
                "or pass --server / set GPUPOOL_SERVER"
            ) from None
        if response.status_code >= 400:
            raise _problem(response)
        return response

    def _get(self, model: type[M], path: str, **params: Any) -> M:
        clean = {k: v for k, v in params.items() if v is not None}
        return read_answer(model, self.request("GET", path, params=clean).json())

    def _get_list(self, model: type[M], path: str, **params: Any) -> builtins.list[M]:
        clean = {k: v for k, v in params.items() if v is not None}
        data = self.request("GET", path, params=clean).json()
        return read_answers(model, data)
