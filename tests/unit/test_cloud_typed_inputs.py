"""The cloud programs build nested resource inputs with the providers' typed ``*Args`` classes,
so a misspelled field fails at construction in every unit test (a mock accepts any dict)."""

from __future__ import annotations

import ast
from pathlib import Path

import pulumi_aws as aws
import pulumi_gcp as gcp
import pytest

from skyward_iac.infra.programs import aws as aws_program
from skyward_iac.infra.programs import gcp as gcp_program

PROGRAMS = [Path(aws_program.__file__), Path(gcp_program.__file__),
            Path(aws_program.__file__).with_name("aws_network.py")]
#: Inputs whose type is a plain map (string -> string): a dict is right for them.
MAPS = {"tags", "labels", "default_tags", "default_labels", "metadata", "triggers"}


def resource_calls(tree: ast.AST) -> list[ast.Call]:
    """Calls of ``aws.…(...)`` / ``gcp.…(...)``: resources, invokes and Args classes."""
    def root(node: ast.expr) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and root(node.func) in ("aws", "gcp")]


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.name)
def test_no_nested_input_is_a_plain_dict(path: Path) -> None:
    untyped = []
    for call in resource_calls(ast.parse(path.read_text())):
        for keyword in call.keywords:
            value = keyword.value
            literal = isinstance(value, ast.Dict) or (
                isinstance(value, (ast.List, ast.ListComp))
                and any(isinstance(e, ast.Dict) for e in ast.walk(value)))
            if literal and keyword.arg not in MAPS:
                untyped.append(f"{path.name}:{value.lineno} {keyword.arg}=")
    assert not untyped, f"build these with the provider's *Args classes: {untyped}"


def test_a_misspelled_field_fails_at_construction() -> None:
    with pytest.raises(TypeError, match="market_typ"):
        aws.ec2.InstanceInstanceMarketOptionsArgs(market_typ="spot")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="provisioning_modl"):
        gcp.compute.InstanceSchedulingArgs(provisioning_modl="SPOT")  # type: ignore[call-arg]
