"""One ready node of a pool: its SSH connection and its agent connection."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import fabric

from skyward_iac.api.runtime import InstanceInfo
from skyward_iac.api.spec import Options, Spec
from skyward_iac.infra.stack import ClusterOutputs, NodeAddress
from skyward_iac.remote import ssh
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.bootstrap import BootstrapPlan, EtcdServerPlan, bootstrap
from skyward_iac.remote.volumes import MountPlan, unmount_script

log = logging.getLogger("skyward")


def plan_for(address: NodeAddress, spec: Spec, options: Options,
             etcd: EtcdServerPlan | None = None, volumes: MountPlan | None = None) -> BootstrapPlan:
    """How to bootstrap ``address`` for ``spec``: interpreter, uv, packages, env, slots."""
    client_minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    wanted = client_minor if spec.image.python == "auto" else spec.image.python
    uv: str | None = None
    python = wanted
    if spec.provider.kind == "local":
        import uv as uv_package

        uv = uv_package.find_uv_bin()
        if wanted == client_minor:
            python = sys.executable  # same machine: use this very interpreter, no discovery
    return BootstrapPlan(
        node=address.index, workdir=address.workdir, python=python, uv=uv,
        pip=spec.image.pip, env=dict(spec.image.env),
        concurrency=options.worker.concurrency,
        executor=options.worker.resolved_executor,
        fresh_processes=not options.worker.reuse_processes,
        etcd=etcd if address.index == 0 else None,
        ttl=spec.ttl,
        volumes=volumes or MountPlan(),
        # A Local node's workdir is <sandbox>/work; its watchdog stops the whole sandbox.
        sandbox=str(PurePosixPath(address.workdir).parent) if spec.provider.kind == "local" else None,
        timeout=options.bootstrap_timeout or spec.image.bootstrap_timeout,
    )


@dataclass
class Node:
    """A connected, bootstrapped node with its agent ready for tasks."""

    address: NodeAddress
    connection: fabric.Connection
    agent: AgentClient
    plan: BootstrapPlan | None = None

    @classmethod
    def start(cls, address: NodeAddress, outputs: ClusterOutputs, plan: BootstrapPlan,
              ssh_timeout: float, instance: InstanceInfo,
              on_output: Callable[[int, str, str], Any], collections: Any = None,
              on_lost: Callable[[int], Any] | None = None) -> Node:
        """Connect over SSH (pinned host key), bootstrap, open the agent tunnel, and tell the
        agent where the node sits in the pool."""
        connection = ssh.connect(address, outputs.ssh_private_key, ssh_timeout)
        try:
            port = bootstrap(connection, plan, outputs.agent_token)
            channel = ssh.open_tunnel(connection, port, ssh_timeout)
            agent = AgentClient(channel, outputs.agent_token, address.index, on_output, on_lost)
            node = cls(address, connection, agent, plan)
            node.configure(instance, collections)
        except BaseException:
            connection.close()
            raise
        return node

    def configure(self, instance: InstanceInfo, collections: Any = None) -> None:
        """(Re)tell the agent its place in the pool, e.g. after a peer was replaced."""
        computed = {"global_worker_index", "total_workers", "is_head", "hostname"}
        self.agent.configure(instance.model_dump(exclude=computed), collections)

    def close(self) -> None:
        """Close the agent channel, unmount the node's volumes (so buffered writes reach the
        bucket before the node goes away), and close the SSH connection."""
        try:
            self.agent.close()
            if self.plan is not None and self.plan.volumes.unmount:
                result = self.connection.run(
                    unmount_script(self.plan.volumes, self.address.workdir), hide=True,
                    warn=True, timeout=60, in_stream=False)
                if result.exited != 0:
                    log.warning("node %d: unmounting volumes failed (%s): %s",
                                self.address.index, result.exited, result.stderr.strip()[-300:])
        except Exception as exc:  # noqa: BLE001 - the node is going away anyway
            log.warning("node %d: unmounting volumes failed: %s", self.address.index, exc)
        finally:
            self.connection.close()
