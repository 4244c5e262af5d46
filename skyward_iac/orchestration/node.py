"""One ready node of a pool: its SSH connection and its agent connection."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import fabric

from skyward_iac.api.runtime import InstanceInfo
from skyward_iac.api.spec import Options, Spec
from skyward_iac.infra.stack import ClusterOutputs, NodeAddress
from skyward_iac.observability.events import (
    BootstrapConsole,
    BootstrapPhase,
    Event,
    InstanceBootstrapped,
)
from skyward_iac.remote import ssh
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.bootstrap import BootstrapPlan, EtcdServerPlan, bootstrap
from skyward_iac.remote.bootstrap_progress import StepUpdate
from skyward_iac.remote.includes import IncludesArchive, build_archive
from skyward_iac.remote.volumes import MountPlan, unmount_script

log = logging.getLogger("skyward")

#: The client's network settings a Local node inherits (it shares this machine's network, but
#: its sshd session starts with a clean environment): proxies, CA bundles, package indexes and
#: the uv cache (so every node hard-links the same downloaded wheels). Image.env wins.
LOCAL_NETWORK_ENV = (
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CERT",
    "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_NATIVE_TLS",
    "UV_CACHE_DIR",
)


def local_network_env() -> dict[str, str]:
    """The subset of this process's environment named by ``LOCAL_NETWORK_ENV``."""
    return {name: os.environ[name] for name in LOCAL_NETWORK_ENV if name in os.environ}


def plan_for(address: NodeAddress, spec: Spec, options: Options,
             etcd: EtcdServerPlan | None = None, volumes: MountPlan | None = None,
             includes: IncludesArchive | None = None) -> BootstrapPlan:
    """How to bootstrap ``address`` for ``spec``: interpreter, uv, packages, env, slots.

    ``includes``: the Image's includes already packed (a pool packs them once, so every node,
    replacements included, gets the same code); packed here when not given."""
    client_minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    wanted = client_minor if spec.image.python == "auto" else spec.image.python
    uv: str | None = None
    python = wanted
    if spec.provider.kind == "local":
        import uv as uv_package

        uv = uv_package.find_uv_bin()
        if wanted == client_minor:
            python = sys.executable  # same machine: use this very interpreter, no discovery
    image = spec.image
    return BootstrapPlan(
        node=address.index, workdir=address.workdir, python=python, uv=uv,
        pip=image.pip,
        pip_indexes=tuple((index.url, index.packages) for index in image.pip_indexes),
        apt=image.apt, shell_vars=dict(image.shell_vars),
        env={**(local_network_env() if spec.provider.kind == "local" else {}), **image.env},
        includes=includes or (build_archive(image.includes, image.excludes)
                              if image.includes else None),
        # "auto" ships the client's own copy: the node then runs exactly the client's code.
        skyward_source="pypi" if image.skyward_source == "pypi" else "local",
        metrics=image.metrics or (),
        cloud_init=spec.provider.kind != "local",
        concurrency=options.worker.concurrency,
        executor=options.worker.resolved_executor,
        fresh_processes=not options.worker.reuse_processes,
        etcd=etcd if address.index == 0 else None,
        ttl=spec.ttl,
        volumes=volumes or MountPlan(),
        # A Local node's workdir is <sandbox>/work; its watchdog stops the whole sandbox.
        sandbox=str(PurePosixPath(address.workdir).parent) if spec.provider.kind == "local" else None,
        # Options.bootstrap_timeout (the pool's) wins over Image.bootstrap_timeout when set.
        timeout=options.bootstrap_timeout or image.bootstrap_timeout,
        preemption=spec.provider.kind if spec.provider.kind in ("aws", "gcp") else None,
    )


def _bootstrap_reporters(
    stack: str, node: int, on_event: Callable[[Event], Any] | None,
) -> tuple[Callable[[StepUpdate], Any] | None, Callable[[str], Any] | None]:
    """The bootstrap's step and line callbacks, as ``BootstrapPhase``/``BootstrapConsole``."""
    if on_event is None:
        return None, None

    def on_step(update: StepUpdate) -> None:
        on_event(BootstrapPhase(stack=stack, node=node, phase=update.name, status=update.status,
                                index=update.index, total=update.total,
                                duration=update.duration, detail=update.detail))

    def on_line(line: str) -> None:
        on_event(BootstrapConsole(stack=stack, node=node, line=line))

    return on_step, on_line


@dataclass
class Node:
    """A connected, bootstrapped node with its agent ready for tasks."""

    address: NodeAddress
    connection: fabric.Connection
    agent: AgentClient
    plan: BootstrapPlan | None = None
    #: The pool's node-side plugin hooks, pickled (sent with every Configure).
    plugins: bytes | None = None

    @classmethod
    def start(cls, address: NodeAddress, outputs: ClusterOutputs, plan: BootstrapPlan,
              ssh_timeout: float, instance: InstanceInfo,
              on_output: Callable[[int, str, str], Any], collections: Any = None,
              on_lost: Callable[[int], Any] | None = None, plugins: bytes | None = None,
              on_event: Callable[[Event], Any] | None = None, stack: str = "") -> Node:
        """Connect over SSH (pinned host key), bootstrap, open the agent tunnel, and tell the
        agent where the node sits in the pool. ``on_event`` hears each bootstrap step
        (``BootstrapPhase``), its output lines and, at the end, ``InstanceBootstrapped``."""
        started = time.monotonic()
        # A cloud instance may still be booting: keep trying while its sshd comes up.
        wait = max(ssh_timeout, ssh.CLOUD_BOOT_WAIT) if plan.cloud_init else ssh_timeout
        connection = ssh.connect(address, outputs.ssh_private_key, ssh_timeout, wait=wait)
        try:
            on_step, on_line = _bootstrap_reporters(stack, address.index, on_event)
            port = bootstrap(connection, plan, outputs.agent_token, on_step, on_line)
            channel = ssh.open_tunnel(connection, port, ssh_timeout)
            agent = AgentClient(channel, outputs.agent_token, address.index, on_output, on_lost)
            node = cls(address, connection, agent, plan, plugins)
            node.configure(instance, collections)
        except BaseException:
            connection.close()
            raise
        if on_event is not None:
            on_event(InstanceBootstrapped(stack=stack, node=address.index,
                                          duration=time.monotonic() - started))
        return node

    def configure(self, instance: InstanceInfo, collections: Any = None) -> None:
        """(Re)tell the agent its place in the pool, e.g. after a peer was replaced."""
        computed = {"global_worker_index", "total_workers", "is_head", "hostname"}
        self.agent.configure(instance.model_dump(exclude=computed), collections, self.plugins)

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
