"""One ready node of a pool: its agent connection, and its SSH connection for the bootstrap,
the fallback tunnel and whatever needs it now and then (``remote/node_ssh.py``)."""

from __future__ import annotations

import itertools
import logging
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from skyward_iac.api.accelerators import vendor_of
from skyward_iac.api.options import Options
from skyward_iac.api.runtime import InstanceInfo
from skyward_iac.api.spec import Spec
from skyward_iac.infra.clouds import cloud
from skyward_iac.node.messages import PreemptionNotice
from skyward_iac.observability.events import (
    BootstrapConsole,
    BootstrapPhase,
    Event,
    InstanceBootstrapped,
)
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.outputs import ClusterOutputs, EtcdMaterial, NodeAddress
from skyward_iac.remote import container as docker
from skyward_iac.remote import data_port, ssh
from skyward_iac.remote.agent_client import AgentClient, OnLost, Submission
from skyward_iac.remote.bootstrap import BootstrapPlan, DataPortPlan, EtcdServerPlan
from skyward_iac.remote.bootstrap_progress import StepUpdate
from skyward_iac.remote.bootstrap_run import bootstrap
from skyward_iac.remote.includes import IncludesArchive, build_archive
from skyward_iac.remote.node_ssh import NodeSsh
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
             includes: IncludesArchive | None = None,
             pki: EtcdMaterial | None = None) -> BootstrapPlan:
    """How to bootstrap ``address`` for ``spec``: interpreter, uv, packages, env, slots.

    ``includes``: the Image's includes already packed (a pool packs them once, so every node,
    replacements included, gets the same code); packed here when not given. ``pki``: the
    stack's certificates (``ClusterOutputs.certificates``), whose server pair the agent's data
    port presents; etcd's when not given."""
    client_minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    wanted = client_minor if spec.image.python == "auto" else spec.image.python
    uv: str | None = None
    python = wanted
    image_ref = spec.provider.container_image
    local = spec.provider.on_this_machine
    if local and image_ref is None:
        import uv as uv_package

        uv = uv_package.find_uv_bin()
        if wanted == client_minor:
            python = sys.executable  # same machine: use this very interpreter, no discovery
    image = spec.image
    bind = cloud(spec.provider.kind).data_bind(address.private_address)
    return BootstrapPlan(
        node=address.index, workdir=address.workdir, python=python, uv=uv,
        pip=image.pip,
        pip_indexes=tuple((index.url, index.packages) for index in image.pip_indexes),
        apt=image.apt, shell_vars=dict(image.shell_vars),
        env={**(local_network_env() if local else {}), **image.env},
        includes=includes or (build_archive(image.includes, image.excludes)
                              if image.includes else None),
        # "auto" ships the client's own copy: the node then runs exactly the client's code.
        skyward_source="pypi" if image.skyward_source == "pypi" else "local",
        metrics=image.metrics or (),
        cloud_init=not local,
        concurrency=options.worker.concurrency,
        executor=options.worker.resolved_executor,
        fresh_processes=not options.worker.reuse_processes,
        etcd=etcd if address.index == 0 else None,
        # Where the provider's firewall lets the client in (Cloud.data_bind: Local, the node's
        # loopback; AWS and GCP, the fixed port their rules open from the SSH range). Not in a
        # container yet. A node whose port cannot be used is reached through the SSH tunnel.
        # A node on this machine also gets a Unix socket in its workdir, preferred to TLS.
        data_port=_data_port_plan(bind, pki, etcd, same_host=local) if image_ref is None else None,
        volumes=volumes or MountPlan(),
        # Options.bootstrap_timeout (the pool's) wins over Image.bootstrap_timeout when set.
        timeout=options.bootstrap_timeout or image.bootstrap_timeout,
        preemption=spec.provider.preemption_notice,
        container=None if image_ref is None else docker.ContainerPlan(
            image=image_ref.tag, name=docker.container_name(address.workdir),
            devices=docker.devices_for(vendor_of(spec.accelerator.name)
                                       if spec.accelerator else None),
            binds=tuple(volume.mount for volume in spec.volumes),
            install=not local),
    )


def _data_port_plan(bind: str | None, pki: EtcdMaterial | None,
                    etcd: EtcdServerPlan | None, same_host: bool = False) -> DataPortPlan | None:
    """The agent's data port where ``bind`` says, presenting the stack's server pair, and a
    local socket beside it when the node is on the client's machine (``same_host``); None
    where the provider opens none or the stack has no PKI."""
    if bind is None:
        return None
    if pki is not None:
        return DataPortPlan(bind, pki.ca_pem, pki.server_cert_pem, pki.server_key_pem,
                            local_socket=same_host)
    if etcd is not None:
        return DataPortPlan(bind, etcd.ca_pem, etcd.cert_pem, etcd.key_pem,
                            local_socket=same_host)
    return None


def _bootstrap_reporters(
    identity: PoolIdentity, node: int, on_event: Callable[[Event], Any] | None,
) -> tuple[Callable[[StepUpdate], Any] | None, Callable[[str], Any] | None]:
    """The bootstrap's step and line callbacks, as ``BootstrapPhase``/``BootstrapConsole``."""
    if on_event is None:
        return None, None

    def on_step(update: StepUpdate) -> None:
        on_event(BootstrapPhase(stack=identity.stack, node=node, phase=update.name,
                                status=update.status, index=update.index, total=update.total,
                                duration=update.duration, detail=update.detail))

    def on_line(line: str) -> None:
        on_event(BootstrapConsole(stack=identity.stack, node=node, line=line))

    return on_step, on_line


@dataclass(frozen=True)
class NodeLaunch:
    """What every node start of one pool shares: the pool's identity, timeouts, and where
    each node's output, events, metrics, notices, results and lost tasks go: every callback
    of a node's ``AgentClient`` is wired from here, in one place (``Node._attached``)."""

    identity: PoolIdentity
    ssh_timeout: float
    ssh_retry_interval: float
    on_output: Callable[[int, str, str], Any]
    on_lost: OnLost
    #: Hears each bootstrap step (``BootstrapPhase``), its lines and ``InstanceBootstrapped``.
    on_event: Callable[[Event], Any] | None = None
    #: Called with (index, ssh, workdir) at the first SSH contact: the heartbeat starts.
    on_contact: Callable[[int, NodeSsh, str], Any] | None = None
    #: Called with (index, ssh, agent) once the agent answers: the heartbeat moves onto it.
    on_attached: Callable[[int, NodeSsh, AgentClient], Any] | None = None
    on_metrics: Callable[[int, tuple[Any, ...]], Any] | None = None
    on_preemption: Callable[[int, PreemptionNotice], Any] | None = None
    #: Results came back (the dispatcher may place more), and a worker started a task.
    on_results: Callable[[], Any] | None = None
    on_started: Callable[[int, Submission], Any] | None = None
    #: The pool's task ids: one sequence for every node, so an id names one task.
    task_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    #: The pool's node-side plugin hooks, pickled (sent with every Configure).
    plugins: bytes | None = None


@dataclass(eq=False)
class Node:
    """A connected, bootstrapped node with its agent ready for tasks (compared by identity).

    Its life is its agent connection. ``connection`` is its SSH, held while the agent is
    reached through it (the fallback tunnel) or while it carries the collections tunnel (the
    head's: losing it loses the node, ``_watch_lifeline``); otherwise released once the agent
    answers over its local socket or data port, and opened again when something needs it."""

    address: NodeAddress
    connection: NodeSsh
    agent: AgentClient
    #: The agent's port on the node's loopback (reached through the SSH tunnel).
    agent_port: int = 0
    plan: BootstrapPlan | None = None
    #: The pool's node-side plugin hooks, pickled (sent with every Configure).
    plugins: bytes | None = None
    #: How the agent is reached (``data_port.LOCAL_SOCKET``, ``DATA_PORT`` or ``SSH_TUNNEL``).
    path: str = data_port.SSH_TUNNEL
    #: Set when the client lets the node go: its SSH closing then is no loss.
    letting_go: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, launch: NodeLaunch, outputs: ClusterOutputs, address: NodeAddress,
              plan: BootstrapPlan, instance: InstanceInfo, collections: Any = None) -> Node:
        """Connect over SSH (pinned host key, the stack's key from ``outputs``), bootstrap,
        reach the agent (its local socket, its data port, or the SSH tunnel), and tell the
        agent where the node sits in the pool."""
        started = time.monotonic()
        connection = _connect(launch, outputs, address, plan)
        try:
            on_step, on_line = _bootstrap_reporters(launch.identity, address.index,
                                                    launch.on_event)
            port = bootstrap(connection.open(), plan, outputs.agent_token, on_step, on_line)
            node = cls._attached(launch, outputs, address, connection, port, plan, instance,
                                 collections)
        except BaseException:
            connection.close()
            raise
        if launch.on_event is not None:
            try:
                launch.on_event(InstanceBootstrapped(stack=launch.identity.stack,
                                                     node=address.index,
                                                     duration=time.monotonic() - started))
            except BaseException:
                node.close()
                raise
        return node

    @classmethod
    def attach(cls, launch: NodeLaunch, outputs: ClusterOutputs, address: NodeAddress,
               port: int, plan: BootstrapPlan, instance: InstanceInfo,
               collections: Any = None) -> Node:
        """Reconnect to a node bootstrapped earlier whose agent listens on ``port`` (a warm
        pool's): SSH, the agent's stream and a new ``Configure``, no bootstrap."""
        connection = _connect(launch, outputs, address, plan)
        try:
            return cls._attached(launch, outputs, address, connection, port, plan, instance,
                                 collections)
        except BaseException:
            connection.close()
            raise

    @classmethod
    def _attached(cls, launch: NodeLaunch, outputs: ClusterOutputs, address: NodeAddress,
                  connection: NodeSsh, port: int, plan: BootstrapPlan,
                  instance: InstanceInfo, collections: Any) -> Node:
        stream, path = data_port.agent_stream(connection, address, port,
                                              data_port.certificate_of(outputs),
                                              launch.ssh_timeout, data_port.local_socket_of(
                                                  address.workdir, plan.data_port))
        try:
            agent = AgentClient(stream, outputs.agent_token, address.index, ids=launch.task_ids,
                                on_output=launch.on_output, on_lost=launch.on_lost)
        except BaseException:
            stream.close()
            raise
        agent.on_metrics, agent.on_preemption = launch.on_metrics, launch.on_preemption
        agent.on_results, agent.on_started = launch.on_results, launch.on_started
        node = cls(address, connection, agent, port, plan, launch.plugins, path)
        try:
            node.configure(instance, collections)
            if launch.on_attached is not None:  # beats go over the agent from now on
                launch.on_attached(address.index, connection, agent)
        except BaseException:
            # Nothing else closes an agent client that never joined: over a socket of its own,
            # its stream (and reader thread) would outlive the pool.
            node.letting_go.set()
            agent.close()
            raise
        node._settle_ssh(carries_collections=address.index == 0 and outputs.etcd is not None,
                         on_lost=launch.on_lost)
        return node

    def _settle_ssh(self, carries_collections: bool, on_lost: OnLost) -> None:
        """Release the SSH connection the agent no longer needs, or watch the head's, which
        carries the collections tunnel, as a lifeline (``data_port.keeps_ssh``)."""
        if not data_port.keeps_ssh(self.path, carries_collections):
            self.connection.release()
        elif self.path != data_port.SSH_TUNNEL:
            transport = self.connection.held_transport
            if transport is not None:
                threading.Thread(target=self._watch_lifeline, args=(transport, on_lost),
                                 name=f"skyward-ssh-lifeline-{self.index}", daemon=True).start()

    def _watch_lifeline(self, transport: Any, on_lost: OnLost) -> None:
        """When the head's SSH connection ends (its collections tunnel with it) while the
        client still holds the node, the node is lost, as a tunnelled node is when its agent
        channel breaks: its etcd is out of the client's reach."""
        transport.join()
        if not self.letting_go.is_set():
            on_lost(self.index, [], "its SSH connection (the collections tunnel to its etcd) "
                                    "was lost")

    @property
    def index(self) -> int:
        return self.address.index

    def configure(self, instance: InstanceInfo, collections: Any = None) -> None:
        """(Re)tell the agent its place in the pool, e.g. after a peer was replaced."""
        computed = {"global_worker_index", "total_workers", "is_head", "hostname"}
        if "network" not in instance.model_fields_set:
            computed.add("network")  # the node tells its own (node/facts.py)
        self.agent.configure(instance.model_dump(exclude=computed), collections, self.plugins)

    def fence(self, timeout: float = 10.0) -> bool:
        """Kill the node's agent and every worker of it over SSH, so none of its tasks runs on;
        True once nothing of them is left (False: unreachable, the stack must remove it)."""
        try:
            command = fence_command(self.address.workdir)
            if self.plan is not None and self.plan.container is not None:  # container pids
                command = docker.inside(self.plan.container, command)
            result = self.connection.run(command, hide=True,
                                         warn=True, timeout=timeout, in_stream=False)
        except Exception as exc:  # noqa: BLE001 - unreachable: the caller falls back
            log.info("node %d: fencing over SSH failed: %s", self.index, exc)
            return False
        return result.exited == 0

    def detach(self) -> list[Submission]:
        """Close the client's connections but leave the node as it is (agent running, volumes
        mounted), for a warm pool's next user. Returns the tasks still pending on it."""
        self.letting_go.set()
        pending = self.agent.close()
        self.connection.close()
        return pending

    def close(self) -> list[Submission]:
        """Close the agent channel, unmount the node's volumes (so buffered writes reach the
        bucket before the node goes away), and close the SSH connection. Returns the tasks
        that were still pending on it (unresolved: the caller decides)."""
        self.letting_go.set()
        pending = self.agent.close()
        try:
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
        return pending


def _connect(launch: NodeLaunch, outputs: ClusterOutputs, address: NodeAddress,
             plan: BootstrapPlan) -> NodeSsh:
    """SSH to ``address`` (retried while a cloud instance boots); the heartbeat starts now."""
    timeout = launch.ssh_timeout
    wait = max(timeout, ssh.CLOUD_BOOT_WAIT) if plan.cloud_init else timeout
    connection = NodeSsh(address, outputs.ssh_private_key, timeout, launch.ssh_retry_interval,
                         ssh.connect(address, outputs.ssh_private_key, timeout, wait=wait,
                                     retry_interval=launch.ssh_retry_interval))
    if launch.on_contact is not None:
        try:
            launch.on_contact(address.index, connection, address.workdir)
        except BaseException:
            connection.close()
            raise
    return connection


def fence_command(workdir: str) -> str:
    """A shell command that kills a node's agent with its whole process group (its workers)
    and exits 0 once none of them is left running (1 if some survive 5 s). A killed process
    its parent has not reaped yet (a zombie: ``kill -0`` still finds it) runs nothing: an init
    that reaps late must not make the fence fail. POSIX
    ``sh`` throughout (a container's ``sh`` is often dash, whose ``kill`` takes ``-s KILL --
    -PGID`` but refuses ``-KILL -- -PGID``)."""
    pid_file = shlex.quote(f"{workdir}/run/agent.pid")
    # /proc/PID/stat after the command's closing paren: state, ppid, process group, ...
    running = ('for f in /proc/[0-9]*/stat; do read -r s 2>/dev/null < "$f" || continue; '
               'set -- ${s##*")"}; [ "$3" = "$pid" ] && [ "$1" != Z ] && return 0; done; '
               'return 1')
    return (f'pid=$(cat {pid_file} 2>/dev/null) || exit 0; [ -n "$pid" ] || exit 0; '
            'kill -s KILL -- -"$pid" 2>/dev/null; kill -s KILL "$pid" 2>/dev/null; '
            f'running() {{ {running}; }}; '
            'for _ in $(seq 1 50); do running || exit 0; sleep 0.1; done; '
            'exit 1')
