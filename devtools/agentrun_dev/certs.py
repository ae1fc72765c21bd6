"""Certificates and keys for a local kube-apiserver, generated with `cryptography`.

One call writes a throw-away PKI into a directory: a CA (its key kept, mode 0600, so more
client certificates can be issued), the apiserver's serving certificate for 127.0.0.1 /
localhost / the ``kubernetes`` Service, an admin client certificate in group
``system:masters`` (cluster admin under RBAC), and the RSA key pair that signs
service-account tokens. `issue_client_cert` signs further client certificates (the node's
kubelet, controller-manager, scheduler, kube-proxy). `generate_server_tls` writes a CA of its
own and one serving certificate for other servers of the stack (nats-server).

What belongs here: PEM files only; nothing about processes or kubeconfigs.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)
_PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclasses.dataclass(frozen=True, slots=True)
class Pki:
    """Paths of the PEM files written by `generate_pki` (all in one directory)."""

    ca_cert: Path
    ca_key: Path
    """The CA's private key (mode 0600), for `issue_client_cert`."""
    serving_cert: Path
    """kube-apiserver's certificate, SANs 127.0.0.1, ::1, localhost, the ``kubernetes``
    Service's names, and `generate_pki`'s ``extra_ips``."""
    serving_key: Path
    admin_cert: Path
    """Client certificate CN=agentrun-admin, O=system:masters."""
    admin_key: Path
    service_account_key: Path
    """RSA-2048 private key (PKCS#8) that signs service-account tokens."""
    service_account_pub: Path
    """Its public key, which verifies them."""
    front_proxy_ca: Path
    """The request-header CA (a CA of its own, key not kept): aggregated API servers believe
    ``X-Remote-User`` only from a client it signed (``--requestheader-client-ca-file``)."""
    front_proxy_cert: Path
    """The kube-apiserver's client certificate as the front proxy, CN ``front-proxy-client``
    (``--proxy-client-cert-file``)."""
    front_proxy_key: Path


def generate_pki(directory: Path, *, extra_ips: Sequence[str] = ()) -> Pki:
    """Write a fresh PKI into `directory` (created if needed; keys are mode 0600).

    `extra_ips` are added to the serving certificate's SANs, e.g. the ``kubernetes``
    Service's ClusterIP that in-cluster clients connect to. Returns the file paths. Raises
    OSError if the directory cannot be written, ValueError for a malformed IP.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        service_account_key=directory / "sa.key",
        service_account_pub=directory / "sa.pub",
        front_proxy_ca=directory / "front-proxy-ca.crt",
        front_proxy_cert=directory / "front-proxy-client.crt",
        front_proxy_key=directory / "front-proxy-client.key",
    )
    ca_key, ca_cert = _self_signed_ca("agentrun-dev-ca")
    ca_name = ca_cert.subject
    _write_cert(pki.ca_cert, ca_cert)
    _write_key(pki.ca_key, ca_key)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        x509.DNSName("localhost"),
        *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
        *(
            x509.DNSName(name)
            for name in (
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            )
        ),
    ]
    serving_cert = _leaf(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        serving_key,
        ca_key,
        ca_name,
        server_names=sans,
    )
    _write_cert(pki.serving_cert, serving_cert)
    _write_key(pki.serving_key, serving_key)

    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin_subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "agentrun-admin"),
        ]
    )
    admin_cert = _leaf(admin_subject, admin_key, ca_key, ca_name)
    _write_cert(pki.admin_cert, admin_cert)
    _write_key(pki.admin_key, admin_key)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    _write_front_proxy(pki)
    return pki


FRONT_PROXY_CLIENT = "front-proxy-client"
"""The front proxy's common name (``--requestheader-allowed-names``), as kubeadm names it."""


def _write_front_proxy(pki: Pki) -> None:
    """A front-proxy CA of its own and the kube-apiserver's client certificate signed by it."""
    ca_key, ca_cert = _self_signed_ca("agentrun-dev-front-proxy-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, FRONT_PROXY_CLIENT)])
    cert = _leaf(subject, key, ca_key, ca_cert.subject)
    _write_cert(pki.front_proxy_ca, ca_cert)
    _write_cert(pki.front_proxy_cert, cert)
    _write_key(pki.front_proxy_key, key)


@dataclasses.dataclass(frozen=True, slots=True)
class ServerTls:
    """Paths of the PEM files written by `generate_server_tls`."""

    ca_cert: Path
    """The CA clients verify the server against (its key is not kept)."""
    cert: Path
    key: Path


def generate_server_tls(
    directory: Path,
    *,
    common_name: str,
    dns_names: Sequence[str] = ("localhost",),
    ips: Sequence[str] = (),
    peer: bool = False,
) -> ServerTls:
    """Write a fresh CA (``ca.crt``) and a serving certificate signed by it (``tls.crt``,
    ``tls.key`` mode 0600) for `common_name`, valid for 127.0.0.1, ::1, `ips` and
    `dns_names`; with `peer`, valid as a client certificate too (a server that dials its
    peers with it, e.g. a NATS cluster's routes).

    Raises OSError if the directory cannot be written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tls = ServerTls(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    ca_key, ca_cert = _self_signed_ca(f"{common_name}-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips),
        *(x509.DNSName(name) for name in dns_names),
    ]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = _leaf(subject, key, ca_key, ca_cert.subject, server_names=sans, peer=peer)
    _write_cert(tls.ca_cert, ca_cert)
    _write_cert(tls.cert, cert)
    _write_key(tls.key, key)
    return tls


def issue_client_cert(
    pki: Pki, *, name: str, common_name: str, organization: str | None = None
) -> tuple[Path, Path]:
    """Sign a client certificate for `common_name` (in group `organization`) with the CA.

    Writes ``<name>.crt`` and ``<name>.key`` (0600) next to the CA and returns their paths.
    Kubernetes reads the CN as the user and O as the group, e.g. ``system:node:<node>`` in
    ``system:nodes`` for a kubelet. Raises OSError if the files cannot be written or read.
    """
    directory = pki.ca_cert.parent
    loaded = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{pki.ca_key} is not the EC key generate_pki writes")
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization is not None:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _leaf(x509.Name(attributes), key, loaded, ca_cert.subject)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    _write_cert(cert_path, cert)
    _write_key(key_path, key)
    return cert_path, key_path


def _self_signed_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A fresh P-256 key and a self-signed CA certificate for `common_name` (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(subject=name, issuer=name, public_key=key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    *,
    server_names: Sequence[x509.GeneralName] = (),
    peer: bool = False,
) -> x509.Certificate:
    """A certificate for `key` signed by the CA: a serving certificate for `server_names`
    (its SANs) when given (with `peer`, a client certificate as well), else a client
    certificate."""
    builder = _builder(subject=subject, issuer=ca_name, public_key=key.public_key())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(server_names), critical=False)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, *usages[:peer]]
    return (
        builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(_key_usage(ca=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )


def _builder(
    *, subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: _PrivateKey) -> None:
    path.touch(mode=0o600)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
