"""An ``up``'s outputs taken from the inline program that exported them (``LeanStack``): the
same values the built engine stored and ``stack output --show-secrets`` reads back (secrets,
nested lists and maps, numbers, nulls), with no ``stack output`` engine start; an export the
program has not made when it returns falls back to the engine's read."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from skyward_iac.infra.engine.lean_stack import LeanStack
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks import stack as stack_module
from tests.integration.test_first_tags import backend  # noqa: F401 - the fixture

#: A file backend of the test's own (the fixture of test_first_tags.py).
pytestmark = pytest.mark.usefixtures("backend")


def _program() -> None:
    pulumi.export("nodes", [{"index": 0, "ssh_port": 2201, "host_key": pulumi.Output.from_input(
        "ssh-ed25519 AAAA"), "workdir": "/w"}, {"index": 1, "ssh_port": 2202, "pair": (1, 2)}])
    pulumi.export("ssh_private_key", pulumi.Output.secret("-----BEGIN KEY-----\nabc\n"))
    pulumi.export("etcd", {"ca": pulumi.Output.secret("pem"), "port": 2379, "none": None})
    pulumi.export("nothing", None)
    pulumi.export("ratio", 0.5)
    pulumi.export("flags", [True, False, None, 1.0])


def _run(name: str, program: Any) -> tuple[dict[str, Any], list[list[str]], LeanStack]:
    made = LeanStack.create(name, stack_module._workspace(program, home.secrets_provider()))
    commands: list[list[str]] = []
    run = made._run_pulumi_cmd_sync

    def watched(args: list[str], *rest: Any, **kwargs: Any) -> Any:
        commands.append(list(args))
        return run(args, *rest, **kwargs)

    made._run_pulumi_cmd_sync = watched  # type: ignore[method-assign]
    result = made.up(color="never")
    return {k: v.value for k, v in result.outputs.items()}, commands, made


def test_an_ups_outputs_are_what_the_engine_stored_without_asking_it() -> None:
    taken, commands, made = _run("local-lean-outputs", _program)
    assert [c[0] for c in commands] == ["up"]  # no `stack output`
    stored = {k: v.value for k, v in made.outputs().items()}  # now read by the engine
    assert ["stack", "output", "--json", "--show-secrets"] in commands
    assert taken == stored
    assert taken["ssh_private_key"] == "-----BEGIN KEY-----\nabc\n"
    assert taken["nodes"][1]["pair"] == [1, 2]
    assert "nothing" not in taken and taken["etcd"]["none"] is None
    made.workspace.remove_stack(made.name)


def test_exports_still_to_come_are_read_from_the_engine() -> None:
    async def later() -> None:  # exports after the program returned: nothing kept here
        _program()

    taken, commands, made = _run("local-lean-fallback", later)
    assert ["stack", "output", "--json", "--show-secrets"] in commands
    assert taken["ssh_private_key"] == "-----BEGIN KEY-----\nabc\n"
    made.workspace.remove_stack(made.name)
