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


# ---- numbers are numbers, everywhere (issue 29 item 8) ---------------------------------------

@pytest.mark.parametrize(("build", "field", "accepted"), [
    (lambda: sky.Compute(provider=sky.Local(), nodes="2"), "nodes",
     "nodes must be an int (nodes=2), a (low, high) tuple of ints"),
    (lambda: sky.Compute(provider=sky.Local(), ttl="10"), "ttl", "must be an int, not the "
     "string '10'; write 10 without quotes"),
    (lambda: sky.Spec(sky.Local(), vcpus="4"), "vcpus", "must be a number (int or float) or "
     "None, not the string '4'"),
    (lambda: sky.Spec(sky.Local(), memory_gb=True), "memory_gb", "not the bool True"),
    (lambda: sky.Spec(sky.Local(), nodes=2.0), "nodes", "got 2.0 (a float)"),
    (lambda: sky.Nodes(desired="3"), "desired", "must be an int, not the string '3'"),
    (lambda: sky.Worker(concurrency="4"), "concurrency", "must be an int, not the string"),
    (lambda: sky.Worker(buffer="8"), "buffer", "must be an int or 'auto', not the string '8'"),
    (lambda: sky.Options(keep_warm="60"), "keep_warm", "must be a number (int or float)"),
    (lambda: sky.Options(default_compute_timeout="ten"), "default_compute_timeout",
     "not the string 'ten'"),
    (lambda: sky.accelerators.A100(count="2"), "count", "must be a number (int or float)"),
    (lambda: sky.HealthChecker(print, interval="5"), "interval", "must be a number"),
])
def test_a_string_or_bool_for_a_number_is_refused_saying_what_is_accepted(
        build: object, field: str, accepted: str) -> None:
    """ttl="10" was coerced while nodes="2" was refused with a message that did not say an
    int works: now every numeric field refuses both, and says what it takes."""
    with pytest.raises(sky.ConfigError) as caught:
        build()  # type: ignore[operator]
    assert f"{field}: " in str(caught.value)
    assert accepted in str(caught.value)


def test_numbers_of_the_other_kind_are_accepted_where_they_fit() -> None:
    assert spec(ttl=sky.time.minutes(10)).ttl == 600  # a whole float where an int is
    assert spec(vcpus=2, memory_gb=4).vcpus == 2.0  # an int where a float is
    assert sky.Worker(buffer="auto").buffer == "auto"  # a literal beside a number
    assert sky.Options(console="log").console == "log"  # bool | literal: no number involved
    with pytest.raises(sky.ConfigError, match="fractional part"):
        spec(ttl=10.5)


@pytest.mark.parametrize(("fields", "refused"), [
    ({"vcpus": 10_000}, "vcpus=10000 (this machine has"),
    ({"memory_gb": 1e7}, "memory_gb=1e+07 (this machine has"),
    ({"vcpus": 10_000, "memory_gb": 1e7}, "vcpus=10000"),
])
def test_a_local_spec_this_machine_cannot_give_is_refused_before_provisioning(
        fields: dict[str, object], refused: str) -> None:
    with pytest.raises(sky.ConfigError) as caught:
        sky.Compute(provider=sky.Local(), **fields)
    assert "a Local node runs on this machine, which cannot give" in str(caught.value)
    assert refused in str(caught.value)


def test_local_fit_is_judged_against_the_machine() -> None:
    from skyward_iac.infra.capacity.local_fit import Machine, shortfalls, this_machine

    laptop = Machine(vcpus=8, memory_gb=16.0, architecture="x86_64")
    assert shortfalls(spec(vcpus=8, memory_gb=16), laptop) == []
    assert shortfalls(spec(vcpus=8.5, memory_gb=17, architecture="arm64"), laptop) == [
        "vcpus=8.5 (this machine has 8)", "memory_gb=17 (this machine has 16.0 GB)",
        "architecture='arm64' (this machine is x86_64)"]
    here = this_machine()
    assert here.vcpus >= 1 and here.memory_gb > 0.1
    sky.Compute(provider=sky.Local(), vcpus=here.vcpus)  # all of it is fine


def test_a_local_spec_that_does_not_fit_falls_back_to_the_next_spec() -> None:
    pool = sky.Compute(sky.Spec(sky.Local(), vcpus=10_000), sky.Spec(sky.AWS(), vcpus=4),
                       options=sky.Options(selection="first"))
    assert pool.choice.spec.provider.kind == "aws"
