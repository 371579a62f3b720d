"""A small, typed Kubernetes API client over HTTPS (httpx), for what gpupool's DRA driver needs.

Why not the official ``kubernetes`` package: the driver calls a handful of endpoints (server-side
apply, get, list, delete, create an Event) on a few kinds. The official client is a 30 MB
generated package whose models lag the API server (``resource.k8s.io/v1`` consumable capacity
fields arrive releases later) and whose server-side apply goes through its dynamic client
anyway. Objects here are plain JSON dictionaries, exactly what the API server speaks; the types
are on the calls (:class:`KubeClient`) and the errors (:class:`KubeError`).

Words:

- **path**: a resource collection or object URL path, e.g. ``/apis/resource.k8s.io/v1/
  resourceslices/NAME``; :meth:`KubeClient.path_for` builds it from ``apiVersion``/``kind`` by
  asking the server's discovery (cached), so manifests of any kind can be applied.
- **apply**: server-side apply (``PATCH`` with ``application/apply-patch+yaml``) under a field
  manager; the server merges and owns the fields, the same call creates or updates.

Credentials come from :class:`KubeConfig`: a kubeconfig file (``--kubeconfig``/``$KUBECONFIG``:
server, CA, client certificate or bearer token, inline ``-data`` fields too) or, inside a pod,
the service account's token and CA.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpupool.domain.errors import GpupoolError

JsonObject = dict[str, Any]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(GpupoolError):
    """An API server answer other than success, or no answer. ``status`` 0 = unreachable."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"kubernetes API: {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class KubeConfigError(GpupoolError):
    """No usable credentials: the message says where gpupool looked and what to set."""


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate to it.

    ``ca_file`` ``None`` uses the system trust store; ``cert_file``/``key_file`` a client
    certificate; ``token`` a bearer token (a service account's, re-read from ``token_file`` on
    each client start when set).
    """

    server: str
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token: str | None = None

    @classmethod
    def load(cls, kubeconfig: Path | None = None) -> KubeConfig:
        """``kubeconfig``, else ``$KUBECONFIG``, else the pod's service account, else
        ``~/.kube/config``."""
        if kubeconfig is not None:
            return cls.from_kubeconfig(kubeconfig)
        env = os.environ.get("KUBECONFIG")
        if env:
            return cls.from_kubeconfig(Path(env.split(os.pathsep)[0]))
        if os.environ.get("KUBERNETES_SERVICE_HOST") and SERVICE_ACCOUNT_DIR.is_dir():
            return cls.in_cluster()
        home = Path.home() / ".kube" / "config"
        if home.is_file():
            return cls.from_kubeconfig(home)
        raise KubeConfigError(
            "no Kubernetes credentials: pass --kubeconfig FILE, set KUBECONFIG, or run in a pod "
            "with a service account"
        )

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeConfigError("KUBERNETES_SERVICE_HOST is not set: not running in a pod")
        if ":" in host:  # IPv6
            host = f"[{host}]"
        token = (SERVICE_ACCOUNT_DIR / "token").read_text().strip()
        return cls(
            server=f"https://{host}:{port}", ca_file=SERVICE_ACCOUNT_DIR / "ca.crt", token=token
        )

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeConfig:
        """The current context of a kubeconfig file; inline ``*-data`` fields are written to a
        private temporary folder (the TLS library reads files)."""
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise KubeConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
        if not isinstance(doc, dict):
            raise KubeConfigError(f"kubeconfig {path} is not a YAML mapping")
        context_name = doc.get("current-context")
        context = _named(doc, "contexts", context_name, path).get("context", {})
        cluster = _named(doc, "clusters", context.get("cluster"), path).get("cluster", {})
        user = _named(doc, "users", context.get("user"), path).get("user", {}) or {}
        server = cluster.get("server")
        if not isinstance(server, str) or not server.startswith("https://"):
            raise KubeConfigError(f"kubeconfig {path}: cluster server must be an https:// URL")
        base = path.parent
        token = user.get("token")
        if token is None and user.get("tokenFile"):
            token = (base / user["tokenFile"]).read_text().strip()
        return cls(
            server=server.rstrip("/"),
            ca_file=_file_or_data(cluster, "certificate-authority", base),
            cert_file=_file_or_data(user, "client-certificate", base),
            key_file=_file_or_data(user, "client-key", base),
            token=token,
        )

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file is not None else None
        )
        if self.cert_file is not None:
            context.load_cert_chain(
                str(self.cert_file), str(self.key_file) if self.key_file else None
            )
        return context


def _named(doc: Mapping[str, Any], section: str, name: object, path: Path) -> Mapping[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    raise KubeConfigError(f"kubeconfig {path}: no {section[:-1]} named {name!r}")


def _file_or_data(section: Mapping[str, Any], key: str, base: Path) -> Path | None:
    if section.get(key):
        return base / str(section[key])
    data = section.get(f"{key}-data")
    if not data:
        return None
    folder = Path(tempfile.mkdtemp(prefix="gpupool-kube-"))
    target = folder / key
    target.write_bytes(base64.b64decode(data))
    target.chmod(0o600)
    return target


@dataclass(frozen=True)
class Resource:
    """One API resource as discovery describes it."""

    group_version: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        prefix = "/api/" if "/" not in self.group_version else "/apis/"
        path = prefix + self.group_version
        if self.namespaced:
            if namespace is None:
                raise KubeError(0, "BadRequest", f"{self.plural} are namespaced: give a namespace")
            path += f"/namespaces/{namespace}"
        path += f"/{self.plural}"
        return path + (f"/{name}" if name else "")


class KubeClient:
    """Synchronous calls to one API server; one HTTP/1.1 connection pool."""

    def __init__(self, config: KubeConfig, *, timeout_s: float = 30.0) -> None:
        headers = {"Accept": "application/json", "User-Agent": "gpupool-kube"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self.config = config
        self._http = httpx.Client(
            base_url=config.server, verify=config.ssl_context(), headers=headers, timeout=timeout_s
        )
        self._discovery: dict[tuple[str, str], Resource] = {}

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- raw calls ----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if content is not None else {}
        try:
            answer = self._http.request(
                method, path, content=content, params=params, headers=headers
            )
        except httpx.HTTPError as exc:
            raise KubeError(0, "Unreachable", f"{self.config.server}: {exc}") from exc
        if answer.status_code >= 400:
            raise _error(answer)
        if not answer.content:
            return {}
        if "json" not in answer.headers.get("content-type", ""):
            return {"text": answer.text}  # /readyz, /healthz, /version answers in plain text
        parsed = answer.json()
        return parsed if isinstance(parsed, dict) else {"value": parsed}

    def get(self, path: str) -> JsonObject:
        return self.request("GET", path)

    def ready(self) -> bool:
        """The API server's ``/readyz`` answers ``ok`` (every check passed)."""
        try:
            return str(self.get("/readyz").get("text", "")).strip() == "ok"
        except KubeError:
            return False

    def get_or_none(self, path: str) -> JsonObject | None:
        try:
            return self.get(path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, path: str, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[JsonObject]:
        params = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        items = self.request("GET", path, params=params).get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def create(self, path: str, body: JsonObject) -> JsonObject:
        return self.request("POST", path, body=body)

    def delete(self, path: str, *, grace_period_s: int | None = None) -> bool:
        """Deletes; ``False`` when it was already gone."""
        body = None if grace_period_s is None else {"gracePeriodSeconds": grace_period_s}
        try:
            self.request("DELETE", path, body=body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def apply(self, body: JsonObject, *, field_manager: str, force: bool = True) -> JsonObject:
        """Server-side apply of one object (its ``apiVersion``, ``kind``, ``metadata.name`` and,
        if namespaced, ``metadata.namespace`` say where)."""
        meta = body.get("metadata") or {}
        resource = self.resource(str(body.get("apiVersion")), str(body.get("kind")))
        path = resource.path(meta.get("namespace") or None, str(meta.get("name")))
        params = {"fieldManager": field_manager}
        if force:
            params["force"] = "true"
        return self.request(
            "PATCH", path, body=body, params=params, content_type="application/apply-patch+yaml"
        )

    # -- discovery -----------------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> Resource:
        """The resource behind ``apiVersion``/``kind``, from the server's discovery."""
        key = (api_version, kind)
        if key not in self._discovery:
            prefix = "/api/" if "/" not in api_version else "/apis/"
            try:
                listing = self.get(prefix + api_version)
            except KubeError as exc:
                if exc.status == 404:
                    raise KubeError(
                        404, "NotFound", f"the API server does not serve {api_version}"
                    ) from exc
                raise
            for entry in listing.get("resources") or []:
                if "/" in entry.get("name", ""):
                    continue  # a subresource
                self._discovery[(api_version, entry["kind"])] = Resource(
                    api_version, entry["name"], bool(entry.get("namespaced"))
                )
        if key not in self._discovery:
            raise KubeError(404, "NotFound", f"the API server has no kind {kind} in {api_version}")
        return self._discovery[key]

    def path_for(self, api_version: str, kind: str, namespace: str | None = None) -> str:
        """The collection path of a kind (in ``namespace`` when it is namespaced)."""
        return self.resource(api_version, kind).path(namespace)


def _error(answer: httpx.Response) -> KubeError:
    try:
        status = answer.json()
    except ValueError:
        status = {}
    if not isinstance(status, dict):
        status = {}
    return KubeError(
        answer.status_code,
        str(status.get("reason") or answer.reason_phrase),
        str(status.get("message") or answer.text[:500]),
    )
