"""The team policy in the backend: strictest-wins per rule kind (a pure function), the stored
object's seal, fail-closed reads, and the ``policy`` commands on a file backend (two homes on
one backend directory stand for two machines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.cli import main
from skyward_iac.infra.capacity import policy, team_policy
from skyward_iac.infra.capacity.policy import Policy, covers, narrowest, strictest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def rules(table: dict, source: str) -> Policy:
    return policy.parse(table, source)


# -- strictest-wins, one rule kind at a time ----------------------------------------------------

@pytest.mark.parametrize("rule", sorted(policy.NUMBERS))
def test_numbers_take_the_smaller_whichever_side_sets_it(rule: str) -> None:
    team, local = rules({rule: 10}, "team"), rules({rule: 4}, "local")
    for order in ((team, local), (local, team)):
        merged = strictest(order)
        assert getattr(merged, rule) == 4 and merged.sources[rule] == "local"
    assert getattr(strictest([team, Policy()]), rule) == 10  # an unset rule lifts nothing


@pytest.mark.parametrize("rule", ["allowed_providers", "allowed_regions",
                                  "allowed_instance_types"])
def test_allow_lists_intersect(rule: str) -> None:
    merged = strictest([rules({rule: ["a", "b", "c"]}, "team"), rules({rule: ["c", "b", "z"]},
                                                                        "local")])
    assert set(getattr(merged, rule)) == {"b", "c"}
    assert merged.sources[rule] == "team and local"
    assert getattr(strictest([rules({rule: ["a"]}, "t"), rules({rule: ["z"]}, "l")]),
                   rule) == ()  # nothing in common: nothing is allowed


def test_allow_list_patterns_intersect_by_coverage() -> None:
    assert narrowest(["g5.*"], ["g5.xlarge", "p4d.24xlarge"]) == ("g5.xlarge",)
    assert narrowest(["eu-*"], ["eu-west-*", "us-east-1"]) == ("eu-west-*",)
    assert narrowest(["eu-west-*"], ["eu-*"]) == ("eu-west-*",)
    # Overlapping, neither covering the other: dropped (allow less, never more).
    assert narrowest(["g5.*"], ["*.xlarge"]) == ()
    assert covers("a*", "ab?") and not covers("a?", "a*") and not covers("ab*", "a*")


def test_required_tags_are_the_union() -> None:
    merged = strictest([rules({"required_tags": ["team"]}, "team"),
                        rules({"required_tags": ["cost-center", "team"]}, "local")])
    assert merged.required_tags == ("team", "cost-center")


def test_the_merge_is_pure_and_order_free() -> None:
    team = rules({"max_nodes": 4, "allowed_regions": ["eu-*"], "required_tags": ["a"]}, "team")
    local = rules({"max_nodes": 8, "allowed_regions": ["eu-west-1"], "max_ttl": 600}, "local")
    one, two = strictest([team, local]), strictest([local, team])
    assert policy.as_table(one) == policy.as_table(two) == {
        "max_nodes": 4, "max_ttl": 600, "allowed_regions": ["eu-west-1"],
        "required_tags": ["a"]}
    assert policy.as_table(team) == {"max_nodes": 4, "allowed_regions": ["eu-*"],
                                     "required_tags": ["a"]}  # inputs unchanged


# -- the stored object --------------------------------------------------------------------------

def test_a_stored_policy_is_sealed_by_its_digest() -> None:
    text = team_policy.render({"max_nodes": 2}, "ops@host", "self-declared", "2026-11-26T00:00")
    stored = team_policy.parse_stored(text.encode(), "here")
    assert stored.rules == {"max_nodes": 2} and stored.by == "ops@host"
    with pytest.raises(team_policy.TeamPolicyError, match="changed after it was pushed"):
        team_policy.parse_stored(text.replace("max_nodes = 2", "max_nodes = 200").encode(),
                                 "here")
    with pytest.raises(team_policy.TeamPolicyError, match="cannot be read"):
        team_policy.parse_stored(text[: len(text) // 2].encode(), "here")


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One shared file backend; machine A (this home) is the one pushing."""
    shared = tmp_path / "team-state"
    shared.mkdir()
    monkeypatch.setenv("SKYWARD_BACKEND_URL", f"file://{shared}")
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home-a"))
    monkeypatch.delenv(policy.POLICY_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    return shared


def test_push_show_diff_on_a_file_backend(backend: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    team = tmp_path / "team.toml"
    team.write_text('[policy]\nmax_nodes = 2\nallowed_providers = ["local", "aws"]\n')
    assert main(["policy", "push", str(team)]) == 0
    out = capsys.readouterr().out
    assert f"pushed to {backend / team_policy.KEY}" in out and "max_nodes: (unset) -> 2" in out
    assert main(["policy", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["team"]["rules"] == {"max_nodes": 2, "allowed_providers": ["local", "aws"]}
    assert shown["team"]["pushed_by_source"] == "self-declared"
    assert shown["in_force"]["rules"]["max_nodes"] == 2
    assert "pushed by" in shown["in_force"]["sources"]["max_nodes"]
    assert main(["policy", "show"]) == 0
    text = capsys.readouterr().out
    assert f"team policy {backend / team_policy.KEY}" in text and "max_nodes = 2" in text
    assert "in force here" in text
    stricter = tmp_path / "stricter.toml"
    stricter.write_text("[policy]\nmax_nodes = 1\n")
    assert main(["policy", "diff", str(stricter)]) == 0
    out = capsys.readouterr().out
    assert "max_nodes: 2 -> 1" in out and 'allowed_providers: ["local", "aws"] -> (unset)' in out
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy]\nmax_nodes = -1\n")
    assert main(["policy", "push", str(bad)]) == 1  # refused before anything is written
    assert "must be a positive number" in capsys.readouterr().err
    assert team_policy.read() is not None and team_policy.read().rules["max_nodes"] == 2


def test_machine_b_cannot_lift_the_team_rule(backend: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    team = tmp_path / "team.toml"
    team.write_text('[policy]\nmax_nodes = 1\nrequired_tags = ["team"]\n')
    assert main(["policy", "push", str(team)]) == 0
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home-b"))  # machine B
    empty = tmp_path / "empty.toml"
    empty.write_text("[policy]\n")
    for env in (None, str(empty)):
        if env is None:
            monkeypatch.delenv(policy.POLICY_ENV, raising=False)
        else:
            monkeypatch.setenv(policy.POLICY_ENV, env)
        with pytest.raises(policy.PolicyError) as refused:  # planned on construction
            sky.Compute(provider=sky.Local(), nodes=2,
                        options=sky.Options(tags={"team": "ml"}, console=False))
        assert "policy.max_nodes (team policy" in str(refused.value)
        assert "grow to 2 nodes" in str(refused.value)
    assert not list(backend.rglob("*.json")), "a stack was written although refused"
    # A local rule stricter than the team's still applies, beside the team's.
    (tmp_path / "skyward.toml").write_text('[policy]\nrequired_tags = ["cost-center"]\n')
    merged = policy.load(tmp_path)
    assert merged.max_nodes == 1 and merged.required_tags == ("team", "cost-center")


def test_a_team_policy_that_cannot_be_read_fails_closed(backend: Path, tmp_path: Path) -> None:
    team = tmp_path / "team.toml"
    team.write_text("[policy]\nmax_nodes = 1\n")
    assert main(["policy", "push", str(team)]) == 0
    stored = backend / team_policy.KEY
    stored.write_text(stored.read_text().replace("max_nodes = 1", "max_nodes = 100"))
    with pytest.raises(team_policy.TeamPolicyError, match="changed after it was pushed"):
        policy.load(tmp_path)
    stored.unlink()  # gone after this machine read it: refused, not lifted
    with pytest.raises(team_policy.TeamPolicyError, match="is gone"):
        policy.load(tmp_path)
    stored.mkdir()  # unreadable (a directory where the object should be)
    with pytest.raises(team_policy.TeamPolicyError, match="cannot be read"):
        policy.load(tmp_path)
    stored.rmdir()
    empty = tmp_path / "empty.toml"
    empty.write_text("[policy]\n")
    assert main(["policy", "push", str(empty)]) == 0  # ops remove the rules on purpose
    assert not policy.load(tmp_path)


def test_a_backend_without_a_place_for_it_holds_none(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("SKYWARD_BACKEND_URL", "gs://team-bucket")
    assert team_policy.location() is None and team_policy.read() is None
    team = tmp_path / "team.toml"
    team.write_text("[policy]\nmax_nodes = 1\n")
    with pytest.raises(sky.ConfigError, match="file:// and s3:// backends only"):
        team_policy.push(policy.as_table(policy.read_file(team)))


def test_a_required_team_policy_fails_closed_on_a_machine_that_never_read_one(
        backend: Path, tmp_path: Path) -> None:
    (tmp_path / "skyward.toml").write_text('[state]\nteam_policy = "required"\n')
    with pytest.raises(team_policy.TeamPolicyError, match="required.*no team policy at"):
        policy.load(tmp_path)
    team = tmp_path / "team.toml"
    team.write_text("[policy]\nmax_nodes = 3\n")
    assert main(["policy", "push", str(team)]) == 0
    assert policy.load(tmp_path).max_nodes == 3
    (tmp_path / "skyward.toml").write_text('[state]\nteam_policy = "optional"\n')
    with pytest.raises(sky.ConfigError, match="must be \"required\""):
        policy.load(tmp_path)
