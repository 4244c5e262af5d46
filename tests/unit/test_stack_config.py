"""Plain settings (stack config, CLI flags) -> Spec/ClusterRequest, and multi-spec Compute."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.stacks.config import cluster_request, known_keys, spec_from_settings


def test_string_settings_become_a_typed_spec() -> None:
    spec = spec_from_settings("aws", {
        "nodes": "3", "accelerator": "a100", "acceleratorMemory": "40GB",
        "acceleratorCount": "2", "vcpus": "8", "maxHourlyCost": "9.5", "ttl": "0",
        "allocation": "on-demand", "region": "us-east-1", "useDefaultVpc": "false",
        "sshCidr": "203.0.113.7/32",
    })
    assert spec.nodes.desired == 3 and spec.ttl == 0 and spec.vcpus == 8
    assert spec.accelerator == sky.accelerators.A100(memory="40GB", count=2)
    assert spec.provider == sky.AWS(use_default_vpc=False, ssh_cidr="203.0.113.7/32")
    assert spec.region == "us-east-1" and spec.max_hourly_cost == 9.5


def test_unknown_names_become_custom_accelerators() -> None:
    spec = spec_from_settings("gcp", {"accelerator": "tpu-v9", "project": "p"})
    assert spec.accelerator == sky.accelerators.Custom("tpu-v9")
    assert spec.provider == sky.GCP(project="p")


@pytest.mark.parametrize(("provider", "settings", "message"), [
    ("local", {"node": "2"}, "unknown local setting(s) node"),
    ("local", {"sshCidr": "1.2.3.4/32"}, "unknown local setting(s) sshCidr"),
    ("aws", {"nodes": "two"}, "nodes must be a whole number (e.g. 2)"),
    ("aws", {"vcpus": "many"}, "vcpus must be a number (e.g. 2 or 2.5)"),
    ("aws", {"ttl": "1.5"}, "ttl must be a whole number"),
    ("aws", {"diskGb": 100.5}, "diskGb must be a whole number"),
    ("aws", {"nodes": "0"}, "nodes must be at least 1"),
    ("aws", {"acceleratorCount": "2"}, "need(s) `accelerator`"),
    ("aws", {"useDefaultVpc": "maybe"}, "useDefaultVpc must be true or false"),
    ("aws", {"allocation": "free"}, "allocation"),
    ("gcp", {"accelerator": "A100", "acceleratorMemory": "13GB"}, "comes with memory"),
    ("azure", {}, "provider must be one of local, aws, gcp"),
])
def test_bad_settings_say_what_is_wrong(provider: str, settings: dict[str, str],
                                        message: str) -> None:
    with pytest.raises(sky.ConfigError) as caught:
        spec_from_settings(provider, settings)
    assert message in str(caught.value)


def test_cluster_request_pins_offer_and_creation_time() -> None:
    request = cluster_request("gcp", {
        "accelerator": "L4", "instanceType": "g2-standard-8", "region": "us-central1",
        "createdAt": "2026-01-01T00:00:00+00:00", "maxLifetime": "3600", "market": "on-demand",
    }, stack_name="skyward-gcp-dev")
    assert request.offer is not None and request.offer.instance_type == "g2-standard-8"
    assert request.offer.region == "us-central1"
    assert request.created_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert request.max_lifetime == 3600 and request.market == "on-demand"
    assert request.stack_name == "skyward-gcp-dev" and request.node_count == 1


@pytest.mark.parametrize(("settings", "message"), [
    ({"accelerator": "L4", "instanceType": "m5.large"}, "does not serve this spec"),
    ({"createdAt": "yesterday"}, "ISO 8601"),
    ({"market": "reserved"}, "market must be"),
])
def test_cluster_request_rejects_bad_pins(settings: dict[str, str], message: str) -> None:
    with pytest.raises(sky.ConfigError) as caught:
        cluster_request("aws", settings, stack_name="s")
    assert message in str(caught.value)


def test_local_stacks_refuse_cloud_only_keys() -> None:
    assert "instanceType" not in known_keys("local")
    with pytest.raises(sky.ConfigError, match="apply to aws and gcp stacks only"):
        cluster_request("local", {"instanceType": "m5.large"}, stack_name="s")


# -- several Specs in sky.Compute (Options.selection) ------------------------------------------

AWS_L4 = sky.Spec(provider=sky.AWS(ssh_cidr="203.0.113.7/32"), accelerator=sky.accelerators.L4(),
                  nodes=2)
GCP_L4 = sky.Spec(provider=sky.GCP(ssh_cidr="203.0.113.7/32"), accelerator=sky.accelerators.L4(),
                  nodes=2)


def test_compute_takes_the_cheapest_of_several_specs() -> None:
    compute = sky.Compute(AWS_L4, GCP_L4)
    expected = offers.select([AWS_L4, GCP_L4], "cheapest")
    assert compute.spec is expected.spec and compute.request.offer == expected.offer
    local = sky.Compute(AWS_L4, sky.Spec(provider=sky.Local(), nodes=2))
    assert local.spec.provider.kind == "local" and local.choice.cluster_hourly == 0


def test_compute_first_takes_the_first_spec_with_an_offer() -> None:
    too_cheap = AWS_L4.model_copy(update={"max_hourly_cost": 0.01})
    compute = sky.Compute(too_cheap, GCP_L4, sky.Spec(provider=sky.Local()),
                          options=sky.Options(selection="first"))
    assert compute.spec is GCP_L4
    assert compute.request.offer == offers.select([GCP_L4]).offer


def test_no_spec_with_an_offer_lists_each_reason() -> None:
    too_cheap = [s.model_copy(update={"max_hourly_cost": 0.01}) for s in (AWS_L4, GCP_L4)]
    with pytest.raises(sky.ConfigError) as caught:
        sky.Compute(*too_cheap)
    message = str(caught.value)
    assert "spec 1 (aws)" in message and "spec 2 (gcp)" in message


def test_selection_must_be_known() -> None:
    with pytest.raises(ValueError):
        sky.Options(selection="random")  # type: ignore[arg-type]
