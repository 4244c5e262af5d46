"""Volume keys in a real stack: the ``volume_keys`` export is a Pulumi secret, readable through
the engine and stored only encrypted in the file backend's state."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi.automation as auto
import pytest

import skyward_iac as sky
from skyward_iac.api.volumes import VolumeKeys, keys_from_outputs
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.exports import volume_exports
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.stack import _workspace

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class KeyedRequest(ClusterRequest):
    volume_keys: Mapping[int, VolumeKeys] = field(default_factory=dict)


def test_volume_keys_are_encrypted_in_the_stack_state() -> None:
    secret = f"volume-secret-{secrets.token_hex(8)}"
    keys = {1: VolumeKeys("volume-access-key", secret)}
    request = KeyedRequest(f"volkeys-{secrets.token_hex(3)}", sky.Spec(provider=sky.Local()), 1,
                           volume_keys=keys)

    def program() -> None:
        for name, value in volume_exports(request).items():
            pulumi.export(name, value)

    # The SDK's own Stack: its outputs() learns which values are secret (LeanStack's does not).
    stack = auto.Stack.create(request.stack_name, _workspace(program))
    try:
        stack.up(on_output=lambda _line: None)
        output = stack.outputs()["volume_keys"]
        assert output.secret is True
        assert keys_from_outputs(output.value) == keys  # what the bootstrap reads back
        state = "".join(p.read_text(errors="replace")
                        for p in home.state_dir().rglob("*") if p.is_file())
        assert request.stack_name in state  # the state was written where we look
        assert secret not in state and "volume-access-key" not in state
    finally:
        stack.destroy(on_output=lambda _line: None)
        stack.workspace.remove_stack(request.stack_name)
