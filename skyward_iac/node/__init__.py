"""The node side: everything that ships to and runs on a node (agent, slots, workers,
watchdog, etcd server, the wire protocol).

Every process skyward starts on a node is started the same way, ``python -m skyward_iac.node
ROLE [ARGS...]`` (``command``), and each role's module exposes ``main(argv)``. What those
processes may import is declared in ``IMPORTS`` and checked (tests/unit/test_node_imports.py);
the import contract in pyproject.toml keeps this package off every client-side package.
"""

from __future__ import annotations

import sys

#: role -> the module whose ``main(argv)`` runs it (node/__main__.py dispatches).
ROLES = {
    "agent": "skyward_iac.node.agent",  # started by bootstrap (remote/bootstrap.py)
    "worker": "skyward_iac.node.worker",  # started by the agent (node/slots.py)
    "watchdog": "skyward_iac.node.watchdog",  # the Local node's (infra/programs/local_node.py)
    "etcd-server": "skyward_iac.node.etcd_server",  # the head node's etcd (remote/bootstrap.py)
}


def command(role: str, *args: str, python: str = sys.executable) -> list[str]:
    """The argv that starts ``role`` with ``args`` under ``python``."""
    if role not in ROLES:
        raise ValueError(f"no node role {role!r}; the roles are {', '.join(ROLES)}")
    return [python, "-m", "skyward_iac.node", role, *args]

#: Every skyward_iac module a node process may import: the closure of ``ROLES`` (and of this
#: package's ``__main__``), function-level imports included. tests/unit/test_node_imports.py
#: computes the closure and fails with the difference; a change here is a change of what a
#: node runs, so say why in the commit.
IMPORTS = frozenset({
    "skyward_iac", "skyward_iac.processes",
    "skyward_iac.api", "skyward_iac.api.deadlines", "skyward_iac.api.errors",
    "skyward_iac.api.function", "skyward_iac.api.metrics", "skyward_iac.api.plugin",
    "skyward_iac.api.runtime",
    # the distributed collections, used from tasks (a Local pool's over the head's unix socket:
    # unix_endpoint); etcd_server writes the PKI's files
    "skyward_iac.collections", "skyward_iac.collections._barrier",
    "skyward_iac.collections._counter", "skyward_iac.collections._dict",
    "skyward_iac.collections._lock", "skyward_iac.collections._queue",
    "skyward_iac.collections._set", "skyward_iac.collections.backend",
    "skyward_iac.collections.base", "skyward_iac.collections.cache",
    "skyward_iac.collections.client", "skyward_iac.collections.context",
    "skyward_iac.collections.deletions",
    "skyward_iac.collections.namespace", "skyward_iac.collections.pki",
    "skyward_iac.collections.session", "skyward_iac.collections.slots",
    "skyward_iac.collections.store", "skyward_iac.collections.unix_endpoint",
    "skyward_iac.node", "skyward_iac.node.__main__", "skyward_iac.node.agent",
    # shared arguments: what an agent keeps per connection, and hands its workers as memfds
    "skyward_iac.node.buffer_cache", "skyward_iac.node.buffer_maps",
    "skyward_iac.node.shared_refs",
    "skyward_iac.node.data_port", "skyward_iac.node.etcd_server", "skyward_iac.node.facts",
    # large buffers a Local client hands over as sealed memfds on the local socket
    "skyward_iac.node.fd_buffers",
    # etcd-server's choice of binary, and its health check without the gRPC client
    "skyward_iac.node.etcd_binary", "skyward_iac.node.etcd_health",
    "skyward_iac.node.messages",
    "skyward_iac.node.lifeline", "skyward_iac.node.plugin_hooks", "skyward_iac.node.task_output",
    # a Local node's agent also listens on a Unix socket in its workdir
    "skyward_iac.node.local_socket",
    "skyward_iac.node.preemption", "skyward_iac.node.protocol", "skyward_iac.node.read_ahead",
    "skyward_iac.node.refusals",
    "skyward_iac.node.relay", "skyward_iac.node.sampler", "skyward_iac.node.slots",
    "skyward_iac.node.watchdog",
    "skyward_iac.node.worker",
})
