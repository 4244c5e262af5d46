"""Team guardrails: every rule refuses a pool before any stack exists, naming the rule, its
limit and the pool's value; several sources merge strictest-wins."""

from __future__ import annotations

from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.infra.capacity import policy
from skyward_iac.infra.capacity.policy import Policy, PoolFacts
from skyward_iac.orchestration.preview import preview

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

POOL = PoolFacts(provider="aws", region="us-east-1", instance_type="g5.xlarge",
                 usd_per_hour=2.012, max_nodes=2, ttl=600, max_lifetime=None,
                 tags={"team": "ml"})


@pytest.mark.parametrize(("rules", "needle"), [
    ({"max_usd_per_hour": 1.5}, "policy.max_usd_per_hour (team.toml): the pool may cost $2.0120/h"),
    ({"max_nodes": 1}, "policy.max_nodes (team.toml): the pool may grow to 2 nodes"),
    ({"max_ttl": 300}, "policy.max_ttl (team.toml): ttl is 600 s, the limit is 300 s"),
    ({"max_lifetime": 3600}, "Options(max_lifetime) is not set, the limit is 3600 s"),
    ({"allowed_providers": ["gcp"]}, "policy.allowed_providers (team.toml): 'aws' is not one of gcp"),
    ({"allowed_regions": ["eu-*"]}, "'us-east-1' is not one of eu-*"),
    ({"allowed_instance_types": ["t3.*", "c7i.*"]}, "'g5.xlarge' is not one of t3.*, c7i.*"),
    ({"required_tags": ["team", "cost-center"]}, "missing tag(s) cost-center"),
])
def test_each_rule_names_itself_its_limit_and_the_value(rules, needle: str) -> None:
    problems = policy.violations(policy.parse(rules, "team.toml"), POOL)
    assert len(problems) == 1 and needle in problems[0], problems


def test_a_pool_within_every_rule_passes() -> None:
    rules = policy.parse({"max_usd_per_hour": 3, "max_nodes": 2, "max_ttl": 600,
                          "allowed_providers": ["aws", "local"], "allowed_regions": ["us-*"],
                          "allowed_instance_types": ["g5.*"], "required_tags": ["team"]}, "t")
    assert policy.violations(rules, POOL) == []


def test_ttl_zero_breaks_a_max_ttl() -> None:
    pool = PoolFacts(provider="aws", region=None, instance_type=None, usd_per_hour=0,
                     max_nodes=1, ttl=0, max_lifetime=None, tags={})
    assert "0 (no dead-man switch)" in policy.violations(Policy(max_ttl=600), pool)[0]


def test_strictest_wins_across_sources() -> None:
    team = policy.parse({"max_nodes": 8, "allowed_regions": ["us-east-1", "us-west-2"],
                         "required_tags": ["team"]}, "team")
    project = policy.parse({"max_nodes": 16, "allowed_regions": ["us-west-2", "eu-west-1"],
                            "required_tags": ["project"], "max_ttl": 900}, "project")
    merged = policy.strictest([team, project])
    assert merged.max_nodes == 8 and merged.sources["max_nodes"] == "team"
    assert merged.allowed_regions == ("us-west-2",)
    assert merged.required_tags == ("team", "project") and merged.max_ttl == 900


@pytest.mark.parametrize(("rules", "needle"), [
    ({"max_nodez": 3}, "unknown policy rule(s) max_nodez"),
    ({"max_nodes": 0}, "policy.max_nodes must be a positive number"),
    ({"allowed_regions": "us-east-1"}, "policy.allowed_regions must be a list of strings"),
])
def test_a_bad_policy_is_a_config_error(rules, needle: str) -> None:
    with pytest.raises(sky.ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        policy.parse(rules, "team.toml")


def test_compute_and_preview_are_refused_before_any_stack(tmp_path: Path, monkeypatch) -> None:
    """The real entry points: a policy file named by SKYWARD_POLICY and [policy] in the
    project's skyward.toml; the refusal comes before a stack directory is written."""
    home = tmp_path / "home"
    monkeypatch.setenv("SKYWARD_HOME", str(home))
    team = tmp_path / "team-policy.toml"
    team.write_text('[policy]\nallowed_providers = ["aws"]\n')
    monkeypatch.setenv(policy.POLICY_ENV, str(team))
    project = tmp_path / "project"
    project.mkdir()
    (project / "skyward.toml").write_text('[policy]\nmax_nodes = 2\n')
    monkeypatch.chdir(project)
    with pytest.raises(policy.PolicyError) as refused:
        with sky.Compute(provider=sky.Local(), nodes=3):
            pass
    message = str(refused.value)
    assert f"policy.allowed_providers ({team}): 'local' is not one of aws" in message
    assert "policy.max_nodes" in message and "grow to 3 nodes" in message
    with pytest.raises(policy.PolicyError, match="allowed_providers"):
        preview(provider=sky.Local())
    assert not (home / "state").exists() or not any((home / "state").rglob("*.json"))


def test_required_tags_come_from_options(tmp_path: Path, monkeypatch) -> None:
    team = tmp_path / "policy.toml"
    team.write_text('required_tags = ["team"]\nmax_ttl = 900\n')  # top-level keys work too
    monkeypatch.setenv(policy.POLICY_ENV, str(team))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(policy.PolicyError, match="missing tag.s. team"):
        preview(provider=sky.AWS(ssh_cidr="1.2.3.4/32"), ttl=600)
    with pytest.raises(sky.ConfigError, match="tag keys"):
        sky.Options(tags={"Bad Key": "x"})


def test_a_named_policy_file_must_exist(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(policy.POLICY_ENV, str(tmp_path / "nope.toml"))
    with pytest.raises(sky.ConfigError, match="no such policy file"):
        policy.load(tmp_path)


def test_user_tags_reach_the_stack_and_every_cloud_resource() -> None:
    from skyward_iac.infra.stacks.tags import stack_tags
    from tests.unit import test_aws_program as aws_tests
    from tests.unit import test_gcp_program as gcp_tests

    tags = {"team": "ml", "cost-center": "c42"}
    mocks, _ = aws_tests.run(aws_tests.aws_spec(None), tags=tags)
    instance = mocks.of_type(aws_tests.INSTANCE)[0].inputs
    assert instance["tags"]["team"] == "ml" and instance["tags"]["skyward-stack"] == "aws-test-1"
    mocks, _ = gcp_tests.run(gcp_tests.gcp_spec(None), tags={**tags, "skyward-stack": "forged"})
    labels = mocks.of_type(gcp_tests.INSTANCE)[0].inputs["labels"]
    assert labels["cost-center"] == "c42"
    assert labels["skyward-stack"] != "forged"  # skyward's own tags cannot be overridden
    assert stack_tags(aws_tests.aws_spec(None), 1, user_tags=tags)["tag.team"] == "ml"


def test_a_reviewed_plan_keeps_no_secret_and_names_each_difference() -> None:
    from skyward_iac.orchestration import reviewed
    from skyward_iac.orchestration.plan import plan_pool

    image = sky.Image(env={"HF_TOKEN": "hf_secret_value"})
    facts = reviewed.plan_facts(plan_pool((), None, None, {"provider": sky.Local(),
                                                          "image": image, "nodes": 2}))
    assert "hf_secret_value" not in str(facts)
    assert facts["spec"]["image"]["env"]["HF_TOKEN"].startswith("sha256:")
    changed = reviewed.plan_facts(plan_pool((), None, None, {
        "provider": sky.Local(), "image": sky.Image(env={"HF_TOKEN": "other"}), "nodes": 3}))
    found = reviewed.differences(facts, changed)
    assert "nodes: 2 -> 3" in found and any(d.startswith("spec.image.env.HF_TOKEN") for d in found)
