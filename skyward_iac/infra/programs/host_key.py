"""A cloud node's SSH host key, generated inside the stack before the node exists.

The private half reaches the node through its user data (cloud-init installs it before sshd
starts) and the public half is pinned in the stack outputs, so the client knows the key before
first contact and never has to trust on first use. Pickled providers reference
``HostKeyProvider`` by path: do not move or rename it.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider

from skyward_iac.infra.identity.credentials import StackCredentials
from skyward_iac.infra.identity.keys import generate_keypair
from skyward_iac.infra.programs.cloud_init import NodeUserData, cloud_config
from skyward_iac.infra.programs.common import ClusterPlan


class HostKeyProvider(ResourceProvider):
    """Generates one ed25519 host key at create; it never changes for the node's life."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        pair = generate_keypair(f"skyward-{props['stack']}-node-{int(props['index'])}")
        outs = {**props, "public_key": pair.public, "private_key": pair.private_pem}
        return CreateResult(id_=f"{props['stack']}/node-{int(props['index'])}/host-key", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in ("stack", "index") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(replaces), replaces=replaces)


class NodeHostKey(Resource, module="skyward", name="NodeHostKey"):
    """Node ``index``'s host key: ``public_key`` (an OpenSSH line), ``private_key`` (secret)."""

    public_key: pulumi.Output[str]
    private_key: pulumi.Output[str]

    def __init__(self, name: str, *, stack: str, index: int,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        props = {"stack": stack, "index": index, "public_key": None, "private_key": None}
        secret = pulumi.ResourceOptions(additional_secret_outputs=["private_key"])
        super().__init__(HostKeyProvider(), name, props, pulumi.ResourceOptions.merge(secret, opts))


def node_boot(plan: ClusterPlan, credentials: StackCredentials, index: int,
              self_delete: bool = False) -> tuple[NodeHostKey, pulumi.Output[str]]:
    """Node ``index``'s host key and the cloud-init user data that installs it, trusts the
    stack's SSH key and arms the TTL watchdog; shared by every cloud program."""
    host_key = NodeHostKey(f"node-{index}-host-key", stack=plan.stack_name, index=index)
    user_data = pulumi.Output.all(
        host_key.private_key, host_key.public_key, credentials.ssh_public_key,
    ).apply(lambda keys: cloud_config(NodeUserData(
        host_private_key=keys[0], host_public_key=keys[1], authorized_key=keys[2],
        ttl=plan.ttl, max_lifetime=plan.max_lifetime, self_delete=self_delete,
    )))
    return host_key, user_data
