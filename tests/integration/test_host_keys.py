"""SSH to nodes trusts only the host key pinned in the stack outputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

import skyward_iac as sky
from skyward_iac.infra.identity.keys import generate_keypair
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.stacks.stack import ClusterStack, new_stack_name
from skyward_iac.infra.stacks.tags import stack_tags
from skyward_iac.outputs import ClusterOutputs
from skyward_iac.remote import ssh


@pytest.fixture(scope="module")
def bare_stack() -> Iterator[ClusterOutputs]:
    """A 1-node stack with no bootstrap: just the sshd to talk to."""
    spec = sky.Spec(provider=sky.Local(), nodes=1)
    request = ClusterRequest(new_stack_name(spec), spec, 1)
    stack = ClusterStack.create(request, stack_tags(spec, 1))
    try:
        yield stack.up()
    finally:
        stack.destroy()


def test_pinned_host_key_connects(bare_stack: ClusterOutputs) -> None:
    conn = ssh.connect(bare_stack.nodes[0], bare_stack.ssh_private_key, timeout=10)
    try:
        assert conn.run("echo ok", hide=True, in_stream=False).stdout.strip() == "ok"
    finally:
        conn.close()


def test_wrong_host_key_is_refused(bare_stack: ClusterOutputs) -> None:
    node = dataclasses.replace(bare_stack.nodes[0], host_key=generate_keypair().public)
    with pytest.raises(sky.HostKeyMismatchError, match="refusing to connect"):
        ssh.connect(node, bare_stack.ssh_private_key, timeout=10)


def test_wrong_client_key_is_refused(bare_stack: ClusterOutputs) -> None:
    with pytest.raises(sky.NodeConnectionError):
        ssh.connect(bare_stack.nodes[0], generate_keypair().private_pem, timeout=10)
