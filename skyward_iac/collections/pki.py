"""The per-stack TLS material of the collections' etcd: a CA, a server and a client certificate.

Pure functions over ``cryptography``: nothing touches the disk or the network. Keys are ECDSA
P-256 (fast to generate, accepted by etcd and gRPC). Every server certificate also carries the
fixed DNS name :data:`SERVER_NAME`; clients verify the server against that name (and the stack's
CA), so the same certificate works whether etcd is reached on its private address, on loopback or
through an SSH tunnel whose local address nobody can predict.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_NAME = "skyward-etcd"
"""DNS name every etcd server certificate carries; clients pin it as the TLS target name."""

DEFAULT_VALID_DAYS = 365
# Clocks of freshly booted cloud nodes can lag the client by a little; never start in the future.
_CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A CA certificate and its private key (PEM); only used to sign the leaf certificates."""

    cert_pem: str
    key_pem: str

    def __repr__(self) -> str:  # never print the private key
        return f"CertificateAuthority(subject={_subject(self.cert_pem)!r})"


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """A leaf certificate, its private key and the CA certificate that signed it (all PEM)."""

    ca_pem: str
    cert_pem: str
    key_pem: str

    def __repr__(self) -> str:  # never print the private key
        return f"IssuedCertificate(subject={_subject(self.cert_pem)!r})"


@dataclass(frozen=True, slots=True)
class ClusterCertificates:
    """Everything one stack needs: the CA certificate, etcd's server pair, the client pair.

    The CA's private key is deliberately not kept: nothing needs to sign later, and a key that
    does not exist cannot leak. New addresses mean a new bundle (see ``ClusterPKI``).
    """

    ca_pem: str
    server_cert_pem: str
    server_key_pem: str
    client_cert_pem: str
    client_key_pem: str

    @property
    def server(self) -> IssuedCertificate:
        """The etcd server's certificate (server and peer usage)."""
        return IssuedCertificate(self.ca_pem, self.server_cert_pem, self.server_key_pem)

    @property
    def client(self) -> IssuedCertificate:
        """The client certificate shared by the agents and the pool's client."""
        return IssuedCertificate(self.ca_pem, self.client_cert_pem, self.client_key_pem)

    def __repr__(self) -> str:  # never print the private keys
        return f"ClusterCertificates(ca={_subject(self.ca_pem)!r})"


def generate_ca(common_name: str, *, valid_days: int = DEFAULT_VALID_DAYS) -> CertificateAuthority:
    """A fresh self-signed CA allowed to sign leaf certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "skyward_iac"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(_cert_pem(cert), _key_pem(key))


def issue_server_certificate(
    ca: CertificateAuthority,
    addresses: Sequence[str],
    *,
    common_name: str = SERVER_NAME,
    valid_days: int = DEFAULT_VALID_DAYS,
) -> IssuedCertificate:
    """etcd's certificate: valid for ``addresses`` (IPs or host names) plus :data:`SERVER_NAME`.

    It carries both serverAuth and clientAuth usages, because etcd presents the same pair as a
    client on its peer links and on its own gRPC gateway.
    """
    names: list[x509.GeneralName] = [x509.DNSName(SERVER_NAME)]
    for address in dict.fromkeys(a.strip() for a in addresses if a.strip()):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            names.append(x509.DNSName(address))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    return _issue(ca, common_name, usages, names, valid_days)


def issue_client_certificate(
    ca: CertificateAuthority,
    common_name: str = "skyward-client",
    *,
    valid_days: int = DEFAULT_VALID_DAYS,
) -> IssuedCertificate:
    """A client certificate (clientAuth only) etcd accepts under ``--client-cert-auth``."""
    return _issue(ca, common_name, [ExtendedKeyUsageOID.CLIENT_AUTH], [], valid_days)


def generate_cluster_certificates(
    stack: str, server_addresses: Sequence[str], *, valid_days: int = DEFAULT_VALID_DAYS
) -> ClusterCertificates:
    """A whole bundle for one stack: new CA, server certificate for the addresses, client one."""
    ca = generate_ca(f"skyward-{stack}-ca", valid_days=valid_days)
    server = issue_server_certificate(ca, server_addresses, valid_days=valid_days)
    client = issue_client_certificate(ca, f"skyward-{stack}-client", valid_days=valid_days)
    return ClusterCertificates(
        ca_pem=ca.cert_pem,
        server_cert_pem=server.cert_pem,
        server_key_pem=server.key_pem,
        client_cert_pem=client.cert_pem,
        client_key_pem=client.key_pem,
    )


def _issue(
    ca: CertificateAuthority,
    common_name: str,
    usages: list[x509.ObjectIdentifier],
    names: list[x509.GeneralName],
    valid_days: int,
) -> IssuedCertificate:
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.encode())
    ca_key = serialization.load_pem_private_key(ca.key_pem.encode(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the CA key must be an ECDSA key made by generate_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "skyward_iac"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=True,
                data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return IssuedCertificate(ca.cert_pem, _cert_pem(cert), _key_pem(key))


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    # PKCS#8 unencrypted: what etcd's Go TLS stack and gRPC's BoringSSL both read.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _subject(cert_pem: str) -> str:
    try:
        return x509.load_pem_x509_certificate(cert_pem.encode()).subject.rfc4514_string()
    except ValueError:
        return "<invalid certificate>"
