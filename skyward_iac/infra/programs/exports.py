"""The outputs every stack program exports, in one shape for every provider."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skyward_iac.infra.cluster_pki import ClusterPKI
from skyward_iac.infra.credentials import StackCredentials


def cluster_exports(stack_name: str, collections: bool, credentials: StackCredentials,
                    nodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``nodes``, ``ssh_private_key``, ``agent_token`` and, with collections, ``etcd``: the
    certificates of the head node's etcd, issued for the head's private address."""
    exports: dict[str, Any] = {
        "nodes": list(nodes),
        "ssh_private_key": credentials.ssh_private_key,
        "agent_token": credentials.agent_token,
    }
    if collections:
        pki = ClusterPKI("etcd-pki", stack=stack_name,
                         server_addresses=[nodes[0]["private_address"]])
        exports["etcd"] = {
            "ca_pem": pki.ca_pem,
            "server_cert_pem": pki.server_cert_pem,
            "server_key_pem": pki.server_key_pem,
            "client_cert_pem": pki.client_cert_pem,
            "client_key_pem": pki.client_key_pem,
        }
    return exports
