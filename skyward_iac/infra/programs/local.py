"""The Local provider's stack: credentials, one ``LocalNode`` per node, the etcd certificates."""

from __future__ import annotations

from collections.abc import Callable

import pulumi

from skyward_iac.api.providers import Local
from skyward_iac.infra.identity.credentials import StackCredentials
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.exports import cluster_exports, volume_exports
from skyward_iac.infra.programs.local_node import FIRST_CONTACT_GRACE, LocalNode
from skyward_iac.infra.stacks.home import local_nodes_dir


def local_program(request: ClusterRequest) -> Callable[[], None]:
    """Declare ``request.node_count`` Local nodes that trust the stack's SSH key."""

    def program() -> None:
        credentials = StackCredentials("credentials", stack=request.stack_name)
        sandbox_root = str(local_nodes_dir())
        provider = request.spec.provider
        grace = (provider.first_contact_grace if isinstance(provider, Local)
                 else FIRST_CONTACT_GRACE)
        nodes = []
        for index in range(request.node_count):
            node = LocalNode(
                f"node-{index}", stack=request.stack_name, index=index,
                authorized_key=credentials.ssh_public_key, sandbox_root=sandbox_root,
                ttl=request.spec.ttl, max_lifetime=request.max_lifetime,
                first_contact=grace,
                # Old and new share the sandbox path: the old one must be gone first, or its
                # deletion stops its successor (a node replaced while alive, e.g. unhealthy).
                opts=pulumi.ResourceOptions(delete_before_replace=True),
            )
            nodes.append({
                "index": index,
                "private_address": node.address,
                "public_address": node.address,
                "ssh_port": node.port,
                "ssh_user": node.user,
                "host_key": node.host_key,
                "workdir": node.workdir,
            })
        exports = {
            **cluster_exports(request.stack_name, request.collections, credentials, nodes),
            **volume_exports(request),
        }
        for name, value in exports.items():
            pulumi.export(name, value)

    return program
