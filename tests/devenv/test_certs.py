"""The generated PKI gives kube-apiserver a serving cert and the admin cluster-admin rights."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agentrun_dev import certs


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_admin_is_in_system_masters_and_signed_by_the_ca(tmp_path: Path) -> None:
    pki = certs.generate_pki(tmp_path)
    admin, ca = load(pki.admin_cert), load(pki.ca_cert)

    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == (
        "system:masters"
    )
    assert admin.issuer == ca.subject
    admin.verify_directly_issued_by(ca)
    usage = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage


def test_the_serving_cert_names_loopback_and_localhost(tmp_path: Path) -> None:
    pki = certs.generate_pki(tmp_path)
    sans = load(pki.serving_cert).extensions.get_extension_for_class(x509.SubjectAlternativeName)

    assert ipaddress.ip_address("127.0.0.1") in sans.value.get_values_for_type(x509.IPAddress)
    assert "localhost" in sans.value.get_values_for_type(x509.DNSName)


def test_the_service_account_key_is_rsa_and_private_files_are_0600(tmp_path: Path) -> None:
    pki = certs.generate_pki(tmp_path)

    assert isinstance(
        load_pem_private_key(pki.service_account_key.read_bytes(), None), rsa.RSAPrivateKey
    )
    for key in (pki.serving_key, pki.admin_key, pki.service_account_key):
        assert key.stat().st_mode & 0o777 == 0o600


def test_the_serving_cert_names_the_kubernetes_service_and_the_extra_ips(tmp_path: Path) -> None:
    pki = certs.generate_pki(tmp_path, extra_ips=["10.96.0.1"])
    sans = load(pki.serving_cert).extensions.get_extension_for_class(x509.SubjectAlternativeName)

    assert ipaddress.ip_address("10.96.0.1") in sans.value.get_values_for_type(x509.IPAddress)
    assert "kubernetes.default.svc.cluster.local" in sans.value.get_values_for_type(x509.DNSName)


def test_an_issued_client_cert_carries_user_and_group_and_is_signed_by_the_ca(
    tmp_path: Path,
) -> None:
    pki = certs.generate_pki(tmp_path)
    cert_path, key_path = certs.issue_client_cert(
        pki, name="kubelet", common_name="system:node:n1", organization="system:nodes"
    )
    cert, ca = load(cert_path), load(pki.ca_cert)

    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:n1"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == (
        "system:nodes"
    )
    cert.verify_directly_issued_by(ca)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    assert key_path.stat().st_mode & 0o777 == 0o600
    assert pki.ca_key.stat().st_mode & 0o777 == 0o600


def test_a_peer_serving_cert_also_authenticates_as_a_client_and_a_plain_one_does_not(
    tmp_path: Path,
) -> None:
    def usages(peer: bool) -> list[x509.ObjectIdentifier]:
        tls = certs.generate_server_tls(tmp_path / str(peer), common_name="n", peer=peer)
        return list(load(tls.cert).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)

    assert usages(False) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert usages(True) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
