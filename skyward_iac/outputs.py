"""What a pool's stack gives back after ``up``: how to reach each node, and the secrets to do it.

Every provider's program exports the same shape, so everything after ``up`` (SSH, bootstrap,
the agent, the collections) is provider-independent. No Pulumi import here: code that runs
near the nodes (``remote/``) uses these values without the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skyward_iac.api.volumes import VolumeKeys, keys_from_outputs


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """How to reach one node after ``up``; the same shape for every provider."""

    index: int
    private_address: str
    public_address: str
    ssh_port: int
    ssh_user: str
    host_key: str
    workdir: str


@dataclass(frozen=True, slots=True)
class EtcdMaterial:
    """The head etcd's CA, server pair and client pair (PEM); secrets."""

    ca_pem: str
    server_cert_pem: str
    server_key_pem: str
    client_cert_pem: str
    client_key_pem: str

    def __repr__(self) -> str:
        return "EtcdMaterial(...)"


@dataclass(frozen=True, slots=True)
class ClusterOutputs:
    """A stack's outputs: its nodes plus the secrets needed to reach them."""

    nodes: tuple[NodeAddress, ...]
    ssh_private_key: str
    agent_token: str
    etcd: EtcdMaterial | None = None
    #: The stack's certificates when it runs no etcd (``cluster=False``): only the agents'
    #: data port uses them. None when ``etcd`` is set (the same material) or the stack has none.
    pki: EtcdMaterial | None = None
    volume_keys: Mapping[int, VolumeKeys] = field(default_factory=dict)

    def __repr__(self) -> str:  # the secrets never reach a log line
        return f"ClusterOutputs(nodes={self.nodes!r})"

    @property
    def certificates(self) -> EtcdMaterial | None:
        """The stack's PKI (CA, server and client pairs), with or without etcd: what the
        agents' data port presents and demands. None for a stack without one."""
        return self.etcd if self.etcd is not None else self.pki

    def node(self, index: int) -> NodeAddress:
        """The address of node ``index`` (``KeyError`` when the stack does not declare it)."""
        for address in self.nodes:
            if address.index == index:
                return address
        raise KeyError(f"the stack declares no node {index}")


def parse_outputs(outputs: Mapping[str, Any]) -> ClusterOutputs:
    """Read ``ClusterOutputs`` from a stack's outputs (values with a ``.value``, as the
    Automation API returns them)."""
    nodes = tuple(
        NodeAddress(
            index=int(n["index"]), private_address=n["private_address"],
            public_address=n["public_address"], ssh_port=int(n["ssh_port"]),
            ssh_user=n["ssh_user"], host_key=n["host_key"], workdir=n["workdir"],
        )
        for n in outputs["nodes"].value
    )
    etcd, pki = outputs.get("etcd"), outputs.get("pki")
    return ClusterOutputs(
        nodes=nodes,
        ssh_private_key=outputs["ssh_private_key"].value,
        agent_token=outputs["agent_token"].value,
        etcd=EtcdMaterial(**etcd.value) if etcd is not None else None,
        pki=EtcdMaterial(**pki.value) if pki is not None else None,
        volume_keys=keys_from_outputs(
            outputs["volume_keys"].value if "volume_keys" in outputs else None),
    )
