"""Spec validation: bad input fails with a clear ConfigError, good input normalizes."""

from __future__ import annotations

import pytest

import skyward_iac as sky
from skyward_iac.api.spec import validated


def spec(**fields: object) -> sky.Spec:
    return validated(sky.Spec, **{"provider": sky.Local(), **fields})


def test_defaults() -> None:
    s = spec()
    assert s.nodes == sky.Nodes(desired=1)
    assert s.ttl == 600 and s.allocation == "spot-if-available" and s.accelerator is None


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [(3, sky.Nodes(desired=3)), ((2, 8), sky.Nodes(desired=2, max=8)),
     (sky.Nodes(desired=4, min=2), sky.Nodes(desired=4, min=2))],
)
def test_node_spec_forms(nodes: object, expected: sky.Nodes) -> None:
    assert spec(nodes=nodes).nodes == expected


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"nodes": 0}, "nodes must be at least 1"),
        ({"nodes": -2}, "nodes must be at least 1"),
        ({"nodes": True}, "nodes must be an int"),
        ({"nodes": (1, 2, 3)}, "(low, high)"),
        ({"nodes": sky.Nodes(desired=2, min=1, max=4)}, None),
        ({"accelerator": "A100"}, "sky.accelerators.A100()"),
        ({"ttl": -1}, "ttl must be >= 0"),
        ({"allocation": "sometimes"}, "allocation"),
        ({"disk_gb": 0}, "disk_gb"),
        ({"provider": "aws"}, "not the string 'aws'"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_invalid_fields_raise_config_error(fields: dict, fragment: str | None) -> None:
    if fragment is None:
        spec(**fields)
        return
    with pytest.raises(sky.ConfigError) as caught:
        spec(**fields)
    assert fragment in str(caught.value)
    assert str(caught.value).startswith("Invalid Spec:")


def test_nodes_bounds_are_ordered() -> None:
    with pytest.raises(ValueError, match="cannot exceed desired"):
        sky.Nodes(desired=2, min=3)
    with pytest.raises(ValueError, match="cannot be below desired"):
        sky.Nodes(desired=5, max=3)


def test_accelerator_objects_are_accepted() -> None:
    s = spec(provider=sky.AWS(), accelerator=sky.accelerators.A100(memory="40GB", count=2))
    assert s.accelerator is not None
    assert (s.accelerator.name, s.accelerator.memory, s.accelerator.count) == ("A100", "40GB", 2)


def test_image_python_version_is_checked() -> None:
    assert sky.Image(python="3.12").python == "3.12"
    with pytest.raises(ValueError, match="python must be 'auto'"):
        sky.Image(python="three")


def test_models_are_frozen() -> None:
    s = spec()
    with pytest.raises(Exception):
        s.ttl = 5  # type: ignore[misc]


def test_compute_rejects_mixed_forms_before_provisioning() -> None:
    with pytest.raises(sky.ConfigError, match="not both"):
        sky.Compute(sky.Spec(provider=sky.Local()), nodes=2)
    with pytest.raises(sky.ConfigError, match="sky.Options"):
        sky.Compute(provider=sky.Local(), options={"worker": 2})
