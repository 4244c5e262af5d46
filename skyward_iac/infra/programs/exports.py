"""The outputs every stack program exports, in one shape for every provider."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi

from skyward_iac.api.volumes import VolumeKeys, keys_for_outputs
from skyward_iac.infra.identity.cluster_pki import ClusterPKI
from skyward_iac.infra.identity.credentials import StackCredentials
from skyward_iac.infra.programs import ClusterRequest


def cluster_exports(stack_name: str, collections: bool, credentials: StackCredentials,
                    nodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``nodes``, ``ssh_private_key``, ``agent_token`` and the stack's PKI (``ClusterPKI``,
    issued for the head's private address and named ``skyward-etcd``): as ``etcd`` with
    collections (the head runs etcd with it), else as ``pki``, which only the agents' data port
    uses (mutual TLS between the client and every node's agent)."""
    exports: dict[str, Any] = {
        "nodes": list(nodes),
        "ssh_private_key": credentials.ssh_private_key,
        "agent_token": credentials.agent_token,
    }
    # One name whether or not etcd runs: a stack's PKI keeps its URN across both.
    pki = ClusterPKI("etcd-pki", stack=stack_name, server_addresses=[nodes[0]["private_address"]])
    exports["etcd" if collections else "pki"] = {
        "ca_pem": pki.ca_pem,
        "server_cert_pem": pki.server_cert_pem,
        "server_key_pem": pki.server_key_pem,
        "client_cert_pem": pki.client_cert_pem,
        "client_key_pem": pki.client_key_pem,
    }
    return exports


def volume_exports(request: ClusterRequest) -> dict[str, Any]:
    """``volume_keys``: the resolved keys of keyed volumes, as a Pulumi secret output.

    The keys come from ``request.volume_keys`` (resolved on the client before ``up``); as a
    secret they are stored encrypted in the stack's state and read back by the bootstrap,
    which writes them to 0600 files on the nodes. Nothing is exported without keyed volumes.
    """
    keys: Mapping[int, VolumeKeys] = getattr(request, "volume_keys", None) or {}
    if not keys:
        return {}
    return {"volume_keys": pulumi.Output.secret(keys_for_outputs(keys))}
