"""Which secrets settings open a stack's state, read from the state itself (pure)."""

from __future__ import annotations

from pulumi import automation as auto

from skyward_iac.infra.stacks.stack_secrets import has_secrets_settings, settings_from_state
from skyward_iac.orchestration.plan_file import local_node_owners

KMS = {"type": "cloud", "state": {"url": "awskms://k?region=us-east-1", "encryptedkey": "QUJD"}}


def test_a_kms_state_gives_its_key_url_and_data_key() -> None:
    found = settings_from_state(KMS)
    assert found is not None
    assert (found.secrets_provider, found.encrypted_key, found.encryption_salt) == (
        "awskms://k?region=us-east-1", "QUJD", None)


def test_a_passphrase_state_gives_its_salt() -> None:
    found = settings_from_state({"type": "passphrase", "state": {"salt": "v1:abc"}})
    assert found is not None and found.encryption_salt == "v1:abc"
    assert found.secrets_provider is None and found.encrypted_key is None


def test_what_is_not_carried_gives_nothing() -> None:
    for providers in (None, {}, {"type": "service", "state": {"url": "https://api"}},
                      {"type": "cloud", "state": {"url": "awskms://k"}},  # no data key
                      {"type": "passphrase", "state": {}}):
        assert settings_from_state(providers) is None, providers


def test_settings_that_name_any_secrets_provider_are_kept() -> None:
    assert not has_secrets_settings(auto.StackSettings(config={"a": "b"}))
    assert has_secrets_settings(auto.StackSettings(encryption_salt="v1:x"))
    assert has_secrets_settings(auto.StackSettings(secrets_provider="awskms://k"))


def test_the_local_nodes_of_an_engine_plan_name_their_directory_and_user() -> None:
    plan = {"resourcePlans": {
        "urn:pulumi:${stack}::skyward::pulumi-python:dynamic/skyward:LocalNode::node-0": {
            "goal": {"inputDiff": {"adds": {"sandbox_root": "/h/local", "user": "ana"}}}},
        "urn:pulumi:${stack}::skyward::pulumi-python:dynamic/skyward:LocalNode::node-1": {
            "goal": {"inputDiff": {"adds": {"sandbox_root": "/h/local", "user": "ana"}}}},
        "urn:pulumi:${stack}::skyward::aws:ec2/instance:Instance::node-0": {
            "goal": {"inputDiff": {"adds": {"ami": "ami-1"}}}},
    }}
    assert local_node_owners(plan) == {("/h/local", "ana")}
    assert local_node_owners({}) == set()
