"""Per-stack secrets generated inside the stack: the SSH key pair and the agent token.

They are created by the engine (never passed on a command line) and stored only as Pulumi
secrets, encrypted in the stack's state. Pickled providers reference ``CredentialsProvider`` by
path: do not move or rename it.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider

from skyward_iac.infra.identity.keys import generate_keypair, generate_token

SECRET_OUTPUTS = ["ssh_private_key", "agent_token"]


class CredentialsProvider(ResourceProvider):
    """Generates the stack's ed25519 SSH key pair and agent token once, at create."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        pair = generate_keypair(f"skyward-{props['stack']}")
        outs = {
            "stack": props["stack"],
            "ssh_public_key": pair.public,
            "ssh_private_key": pair.private_pem,
            "agent_token": generate_token(),
        }
        return CreateResult(id_=f"{props['stack']}/credentials", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = olds.get("stack") != news.get("stack")
        return DiffResult(changes=changed, replaces=["stack"] if changed else [])


class StackCredentials(Resource, module="skyward", name="StackCredentials"):
    """The stack's SSH key pair and agent token; the private parts are Pulumi secrets."""

    ssh_public_key: pulumi.Output[str]
    ssh_private_key: pulumi.Output[str]
    agent_token: pulumi.Output[str]

    def __init__(self, name: str, *, stack: str) -> None:
        props = {"stack": stack, "ssh_public_key": None, "ssh_private_key": None, "agent_token": None}
        opts = pulumi.ResourceOptions(additional_secret_outputs=SECRET_OUTPUTS)
        super().__init__(CredentialsProvider(), name, props, opts)
