"""The per-stack etcd PKI: what each certificate may do, who signed it, what never prints."""

from __future__ import annotations

import ipaddress
import pickle

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from skyward_iac.collections import pki
from skyward_iac.infra.identity.cluster_pki import SECRET_OUTPUTS, ClusterPKI, ClusterPKIProvider


@pytest.fixture(scope="module")
def bundle() -> pki.ClusterCertificates:
    return pki.generate_cluster_certificates("unit", ["10.1.2.3", "fd00::7", "head.internal"])


def _cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def _usages(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_ca_signs_leaves_only(bundle: pki.ClusterCertificates) -> None:
    ca = _cert(bundle.ca_pem)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0
    for pem in (bundle.server_cert_pem, bundle.client_cert_pem):
        leaf = _cert(pem)
        leaf.verify_directly_issued_by(ca)
        assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert leaf.not_valid_before_utc < leaf.not_valid_after_utc


def test_server_certificate_names_every_address_and_the_fixed_name(
    bundle: pki.ClusterCertificates,
) -> None:
    server = _cert(bundle.server_cert_pem)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("10.1.2.3"), ipaddress.ip_address("fd00::7")}
    assert set(names.get_values_for_type(x509.DNSName)) == {pki.SERVER_NAME, "head.internal"}
    # Server usage for clients, client usage for etcd's peer links and gateway.
    assert _usages(server) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_client_certificate_is_for_clients_only(bundle: pki.ClusterCertificates) -> None:
    client = _cert(bundle.client_cert_pem)
    assert _usages(client) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    with pytest.raises(x509.ExtensionNotFound):
        client.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_each_key_matches_its_certificate(bundle: pki.ClusterCertificates) -> None:
    for cert_pem, key_pem in ((bundle.server_cert_pem, bundle.server_key_pem),
                              (bundle.client_cert_pem, bundle.client_key_pem)):
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
        assert key.public_key() == _cert(cert_pem).public_key()
        assert key_pem.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8, read by Go and gRPC


def test_bundles_are_independent() -> None:
    one = pki.generate_cluster_certificates("a", ["10.0.0.1"])
    two = pki.generate_cluster_certificates("a", ["10.0.0.1"])
    with pytest.raises(InvalidSignature):  # another stack's CA did not sign it
        _cert(two.client_cert_pem).verify_directly_issued_by(_cert(one.ca_pem))


def test_reprs_never_show_private_keys(bundle: pki.ClusterCertificates) -> None:
    ca = pki.generate_ca("unit-ca")
    leaf = pki.issue_client_certificate(ca)
    for value in (bundle, bundle.server, bundle.client, ca, leaf):
        text = repr(value) + str(value)
        assert "PRIVATE" not in text and "BEGIN" not in text
    assert "unit-ca" in repr(ca)


def test_provider_creates_secrets_and_forgets_the_ca_key() -> None:
    assert ClusterPKIProvider.__module__ == "skyward_iac.infra.identity.cluster_pki"  # pickled by path
    assert set(SECRET_OUTPUTS) == {"server_key_pem", "client_key_pem"}
    result = ClusterPKIProvider().create({"stack": "s1", "server_addresses": ["10.0.0.9"]})
    outs = result.outs or {}
    assert result.id == "s1/cluster-pki"
    assert set(outs) == {"stack", "server_addresses", "ca_pem", "server_cert_pem",
                         "server_key_pem", "client_cert_pem", "client_key_pem"}
    assert sum("PRIVATE KEY" in str(v) for v in outs.values()) == 2  # no CA key anywhere
    assert "10.0.0.9" in repr(
        _cert(outs["server_cert_pem"]).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value)
    assert pickle.loads(pickle.dumps(ClusterPKIProvider())) is not None


def test_provider_replaces_only_when_addresses_or_stack_change() -> None:
    provider = ClusterPKIProvider()
    olds = {"stack": "s1", "server_addresses": ["10.0.0.1", "10.0.0.2"]}
    same = provider.diff("id", olds, {"stack": "s1", "server_addresses": ["10.0.0.2", "10.0.0.1"]})
    assert not same.changes
    moved = provider.diff("id", olds, {"stack": "s1", "server_addresses": ["10.0.0.3"]})
    assert moved.changes and moved.replaces == ["server_addresses"]
    renamed = provider.diff("id", olds, {**olds, "stack": "s2"})
    assert renamed.replaces == ["stack"]


def test_resource_declares_its_key_outputs_secret() -> None:
    annotations = ClusterPKI.__annotations__
    assert set(SECRET_OUTPUTS) <= set(annotations)
