"""What ``skyward-iac ssh``, ``forward`` and ``cp`` share: finding a live stack's nodes, saying
no in one line, recording the access while it runs, and a connection a long forward keeps.

The stack's outputs give everything needed, from any machine that can read the stack (a shared
backend included): the stack's SSH key (a Pulumi secret, held in memory by paramiko, never
written to disk) and each node's host key, pinned (``remote/ssh.py``). Nothing is asked and
nothing is written to ``~/.ssh``.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from skyward_iac.cli_commands.live import NOT_FOUND, USAGE
from skyward_iac.outputs import ClusterOutputs, NodeAddress

if TYPE_CHECKING:
    import fabric
    import paramiko

    from skyward_iac.infra.stacks.stack import ClusterStack
    from skyward_iac.remote.forward import Trouble

#: How long reaching a node's sshd may take (each attempt, and retries together).
SSH_TIMEOUT = 20.0


class Refused(Exception):
    """A request refused before any node is reached: its exit code and its one line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code

    def report(self) -> int:
        print(f"skyward-iac: {self}", file=sys.stderr)
        return self.code


@dataclass(frozen=True, slots=True)
class LiveTarget:
    """A stack that holds nodes, its outputs, and the nodes a command asked for."""

    stack: ClusterStack
    outputs: ClusterOutputs
    nodes: list[NodeAddress]


def pick_nodes(stack: str, nodes: tuple[NodeAddress, ...], wanted: int | None,
               ) -> list[NodeAddress]:
    """Node ``wanted`` of ``nodes``, or every node by index when None; ``Refused`` (a usage
    error, as ``logs --node`` says it) for a node the stack does not have."""
    ordered = sorted(nodes, key=lambda node: node.index)
    if wanted is None:
        return ordered
    chosen = [node for node in ordered if node.index == wanted]
    if not chosen:
        have = ", ".join(str(node.index) for node in ordered) or "none"
        raise Refused(USAGE, f"{stack} has no node {wanted}; it has nodes {have}")
    return chosen


def live_target(name: str, node: int | None) -> LiveTarget:
    """The stack ``name`` (``StackNotFoundError`` when there is none) with the chosen nodes;
    ``Refused`` when it is down (exit code 3, as ``logs`` says it) or has no such node."""
    from skyward_iac.infra.stacks.stack import ClusterStack

    stack = ClusterStack.select(name)
    try:  # one engine command: a stack that is down (or not up yet) has no outputs at all
        outputs = stack.outputs()
    except KeyError:
        outputs = None
    if outputs is None or not outputs.nodes:
        raise Refused(NOT_FOUND, f"{name} is down: it has no nodes to reach "
                                 f"(its history stays: skyward-iac show {name})")
    return LiveTarget(stack, outputs, pick_nodes(name, outputs.nodes, node))


def connect(node: NodeAddress, outputs: ClusterOutputs) -> fabric.Connection:
    """An SSH connection to ``node`` with the stack's key, trusting its pinned host key only."""
    from skyward_iac.remote import ssh

    return ssh.connect(node, outputs.ssh_private_key, timeout=SSH_TIMEOUT)


class Recording:
    """The access entry of an action (``infra/stacks/access.py``), written in a thread while the
    action runs: its one or two engine commands stay off the action's path."""

    def __init__(self, stack: ClusterStack, action: str) -> None:
        self.action = action
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._write, args=(stack,), daemon=True,
                                        name="skyward-access-log")
        self._thread.start()

    def _write(self, stack: ClusterStack) -> None:
        from skyward_iac.infra.stacks import access

        try:
            access.record(stack, self.action)
        except Exception as exc:  # noqa: BLE001 - told at the end, the action goes on
            self.error = exc

    def finish(self, timeout: float = 60.0) -> None:
        """Wait for the entry; say so on stderr when it could not be written."""
        self._thread.join(timeout)
        if self.error is not None or self._thread.is_alive():
            why = str(self.error or "still writing") or type(self.error).__name__
            print(f"skyward-iac: warning: this access ({self.action}) was not recorded in the "
                  f"stack's access log: {why}", file=sys.stderr)


class NodeLink:
    """A node's SSH connection for a forward that runs for hours: when it is found lost, the
    next forwarded connection opens a new one (None while the node cannot be reached)."""

    def __init__(self, node: NodeAddress, outputs: ClusterOutputs) -> None:
        self._node, self._outputs = node, outputs
        self._lock = threading.Lock()
        self._connection = connect(node, outputs)

    def transport(self) -> paramiko.Transport | None:
        from skyward_iac.api.errors import SkywardError

        with self._lock:
            current = self._connection.transport
            if current is not None and current.is_active():
                return current
            self._connection.close()
            try:
                self._connection = connect(self._node, self._outputs)
            except SkywardError as exc:
                print(f"skyward-iac: node {self._node.index}: {exc}", file=sys.stderr)
                return None
            return self._connection.transport

    def close(self) -> None:
        with self._lock:
            self._connection.close()


class TroubleLines:
    """What a CLI forward tells its user of the troubles its connections meet: one line per
    kind, not again within ``quiet`` seconds (a browser retries many times a second). A
    connection the far end closes is how HTTP servers end theirs: not a trouble here."""

    def __init__(self, node: int, port: int, quiet: float = 10.0) -> None:
        self.node, self.port, self.quiet = node, port, quiet
        self._last: dict[str, float] = {}

    def __call__(self, trouble: Trouble, detail: str) -> None:
        from skyward_iac.remote.forward import Trouble

        if trouble is Trouble.CLOSED_BY_TARGET:
            return
        now = time.monotonic()
        if now - self._last.get(trouble.value, -self.quiet) < self.quiet:
            return
        self._last[trouble.value] = now
        what = (f"nothing listens on port {self.port} on node {self.node}"
                if trouble is Trouble.REFUSED else f"the SSH connection to node {self.node}: "
                                                   f"{detail}")
        print(f"skyward-iac: a forwarded connection was closed: {what}", file=sys.stderr)
