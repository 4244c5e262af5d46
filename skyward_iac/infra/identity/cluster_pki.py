"""The stack's TLS material for the collections' etcd, generated inside the stack.

A CA, etcd's server certificate (valid for the head node's addresses) and the client
certificate of the agents and the pool's client. They are created by the engine at ``create``
and kept only as Pulumi secrets (the private keys) in the stack's encrypted state; the CA's
private key is discarded once both certificates are signed. New ``server_addresses`` replace
the whole bundle. Pickled providers reference ``ClusterPKIProvider`` by path: do not move or
rename it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider

SECRET_OUTPUTS = ["server_key_pem", "client_key_pem"]
_REPLACE_ON = ("stack", "server_addresses")


class ClusterPKIProvider(ResourceProvider):
    """Generates the stack's CA, etcd server and client certificates once, at create."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        # Imported here: the collections package loads etcd's gRPC client (~0.4 s of CPU), which
        # the dynamic-provider process needs only to create a bundle, never to diff or delete.
        from skyward_iac.collections.pki import generate_cluster_certificates

        addresses = [str(a) for a in props.get("server_addresses") or []]
        bundle = generate_cluster_certificates(props["stack"], addresses)
        outs = {
            "stack": props["stack"],
            "server_addresses": addresses,
            "ca_pem": bundle.ca_pem,
            "server_cert_pem": bundle.server_cert_pem,
            "server_key_pem": bundle.server_key_pem,
            "client_cert_pem": bundle.client_cert_pem,
            "client_key_pem": bundle.client_key_pem,
        }
        return CreateResult(id_=f"{props['stack']}/cluster-pki", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [key for key in _REPLACE_ON if _normal(olds.get(key)) != _normal(news.get(key))]
        return DiffResult(changes=bool(replaces), replaces=replaces, delete_before_replace=False)


class ClusterPKI(Resource, module="skyward", name="ClusterPKI"):
    """The stack's etcd CA and certificates; the private keys are Pulumi secrets."""

    ca_pem: pulumi.Output[str]
    server_cert_pem: pulumi.Output[str]
    server_key_pem: pulumi.Output[str]
    client_cert_pem: pulumi.Output[str]
    client_key_pem: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        stack: str,
        server_addresses: pulumi.Input[Sequence[pulumi.Input[str]]],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "stack": stack,
            "server_addresses": server_addresses,
            "ca_pem": None,
            "server_cert_pem": None,
            "server_key_pem": None,
            "client_cert_pem": None,
            "client_key_pem": None,
        }
        secret = pulumi.ResourceOptions(additional_secret_outputs=SECRET_OUTPUTS)
        options = pulumi.ResourceOptions.merge(secret, opts)
        super().__init__(ClusterPKIProvider(), name, props, options)


def _normal(value: Any) -> Any:
    # Address order carries no meaning; a re-ordered list must not re-key the cluster.
    if isinstance(value, list | tuple):
        return sorted(str(v) for v in value)
    return value
