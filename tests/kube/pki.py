"""The throw-away PKI of a test control plane, made with the ``openssl`` command line.

One CA signs the API server's serving certificate (for ``127.0.0.1``, ``localhost`` and the
in-cluster names) and the client certificates: ``admin`` (group ``system:masters``) for the
tests, the scheduler, the controller manager and kwok. The service account key pair signs and
checks service account tokens. EC P-256 keys: a loaded 2-core machine makes them in
milliseconds, where RSA 2048 takes a noticeable share of a second each.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVING_NAMES = (
    "IP:127.0.0.1",
    "IP:10.96.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _key(path: Path) -> None:
    curve = "ec_paramgen_curve:P-256"
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", curve, "-out", str(path))
    path.chmod(0o600)


@dataclass(frozen=True)
class Pki:
    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.folder / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.folder / "sa.pub"

    def cert(self, name: str) -> Path:
        return self.folder / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.folder / f"{name}.key"

    def sign(self, name: str, subject: str, *, server: bool = False) -> None:
        """A key and a certificate ``name`` for ``subject``, signed by the CA."""
        key, csr, cert = self.key(name), self.folder / f"{name}.csr", self.cert(name)
        _key(key)
        _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
        ext = self.folder / f"{name}.ext"
        usage = "serverAuth" if server else "clientAuth"
        lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
        ]
        if server:
            lines.append("subjectAltName=" + ",".join(SERVING_NAMES))
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert), "-CAkey", str(self.ca_key),
            "-CAcreateserial", "-days", "7", "-sha256", "-extfile", str(ext), "-out", str(cert),
        )  # fmt: skip


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    pki = Pki(folder)
    _key(pki.ca_key)
    _openssl(
        "req", "-x509", "-new", "-key", str(pki.ca_key), "-subj", "/CN=gpupool-test-ca",
        "-days", "7", "-sha256", "-out", str(pki.ca_cert),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip
    pki.sign("apiserver", "/CN=kube-apiserver", server=True)
    pki.sign("admin", "/O=system:masters/CN=gpupool-test-admin")
    pki.sign("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    _key(pki.sa_key)
    _openssl("pkey", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub))
    return pki


def kubeconfig(path: Path, server: str, pki: Pki, user: str) -> Path:
    """A kubeconfig for ``server`` as the client certificate ``user``."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {server}
    certificate-authority: {pki.ca_cert}
users:
- name: {user}
  user:
    client-certificate: {pki.cert(user)}
    client-key: {pki.key(user)}
contexts:
- name: test
  context:
    cluster: test
    user: {user}
current-context: test
"""
    )
    path.chmod(0o600)
    return path
