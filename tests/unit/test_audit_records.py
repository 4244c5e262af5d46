"""The audit's records, pure parts: tags within Pulumi's limits, a run's segments and their
totals, the meter that makes them, what ``history`` and ``cost`` make of a run, and who the
actor is."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from skyward_iac.cli_commands import cost, runs
from skyward_iac.infra.identity import cloud_identity
from skyward_iac.infra.stacks import usage
from skyward_iac.infra.stacks.tags import (
    MAX_TAG_NAME,
    MAX_TAG_VALUE,
    SEGMENTS,
    TAG_PREFIX,
    actor_of,
    chunk_keys,
    decode_tags,
    encode_tags,
    placement_tags,
    with_actor,
)
from skyward_iac.infra.stacks.usage import Segment
from skyward_iac.orchestration.cost import CostMeter

ARN = "arn:aws:sts::123456789012:assumed-role/" + "r" * 180 + "/ana"


def within_limits(stored: dict[str, str]) -> None:
    for key, value in stored.items():
        assert len(TAG_PREFIX + key) <= MAX_TAG_NAME, key
        assert len(value) <= MAX_TAG_VALUE, (key, len(value))


def test_tags_are_chunked_within_pulumis_limits_and_read_back() -> None:
    tags = {"owner": "ana@box", "provider": "aws", "actor": ARN, "actor_source": "aws-sts",
            "created_at": "2026-11-22T10:15:02+00:00", "boot_id": "b" * 36,
            "instance_type": "p4d.24xlarge", "region": "us-east-1", "zones": "us-east-1a",
            "market": "spot, 1 of 8 on-demand", "nodes": "8", "usd_per_hour": "98.3200",
            **{f"tag.k{i}": "v" * 63 for i in range(6)},
            SEGMENTS: usage.encode([Segment(i * 60.0, i % 9, i * 1.25) for i in range(40)])}
    stored = encode_tags(tags)
    within_limits(stored)
    assert {"run", "run.1", "run.2", "segments", "segments.1"} <= set(stored)
    assert all(json.loads(stored[k]) for k in stored if k.startswith("run"))  # each alone
    assert decode_tags(stored) == tags
    assert chunk_keys(stored) == {k for k in stored if k.startswith(("run", "segments"))}


def test_a_value_at_the_limit_fits_and_a_longer_one_is_cut() -> None:
    for value in ("x" * 240, '"' * 200, "ü" * 250):  # quotes and non-ASCII escape in JSON
        stored = encode_tags({"note": value})
        within_limits(stored)
        assert value.startswith(decode_tags(stored)["note"])
    exact = "a" * (MAX_TAG_VALUE - len('{"note":""}'))
    assert decode_tags(encode_tags({"note": exact}))["note"] == exact  # at the limit: whole
    assert len(encode_tags({"actor": "a" * 300})["actor"]) == MAX_TAG_VALUE


def test_a_torn_read_loses_a_chunk_not_the_run() -> None:
    stored = encode_tags({f"k{i:02d}": "v" * 40 for i in range(12)})
    torn = {**stored, "run.1": stored["run.1"][:17]}  # written half-way
    decoded = decode_tags(torn)
    assert decoded["k00"] == "v" * 40 and len(decoded) < 12


def test_segments_fold_past_the_chunks_and_keep_the_totals_exact() -> None:
    many = [Segment(i * 30.0, 1 + i % 7, 0.5 * (1 + i % 7)) for i in range(500)]
    folded = usage.fold(many)
    assert len(folded) < 500 and folded[0].folded and not folded[-1].folded
    assert usage.fits(folded) and not usage.fits(many)
    stored = encode_tags({SEGMENTS: usage.encode(folded)})
    assert len([k for k in stored if k.startswith(SEGMENTS)]) <= usage.MAX_SEGMENT_CHUNKS
    end = 500 * 30.0
    exact, kept = usage.totals(many, end), usage.totals(usage.decode(usage.encode(folded)), end)
    assert kept.node_hours == pytest.approx(exact.node_hours, rel=1e-3)
    assert kept.cost_usd == pytest.approx(exact.cost_usd, rel=1e-3)
    assert folded[-5:] == many[-5:]  # the latest changes keep their detail


def test_totals_integrate_each_segment_until_the_next_and_none_past_the_end() -> None:
    segments = [Segment(0, 1, 2.0), Segment(1800, 3, 6.0), Segment(5400, 1, 2.0)]
    totals = usage.totals(segments, 9000)
    assert totals.node_hours == pytest.approx(0.5 + 3 + 1)
    assert totals.cost_usd == pytest.approx(1 + 6 + 2)
    assert usage.totals(segments, 1800).node_hours == pytest.approx(0.5)
    implied = usage.of_tags({"nodes": "4", "usd_per_hour": "1.0000"})
    assert implied == [Segment(0, 4, 1.0)]  # a run without a resize: one segment


def test_merge_keeps_a_warm_pools_earlier_segments() -> None:
    stored = [Segment(0, 2, 1.0), Segment(600, 4, 2.0)]
    fresh = [Segment(1200, 4, 2.0), Segment(1500, 1, 0.5)]
    assert usage.merge(stored, fresh) == [*stored, *fresh]
    assert usage.merge(stored, [Segment(0, 3, 1.5)]) == [Segment(0, 3, 1.5)]


def test_the_meter_records_a_segment_per_change_of_nodes_or_rate() -> None:
    now = [100.0]
    meter = CostMeter(1.0, clock=lambda: now[0], nodes=2)
    now[0] += 600.4
    meter.set_rate(2.0, 4)
    now[0] += 0.3
    meter.set_rate(1.5, 3)  # within the same second: replaces the one before
    now[0] += 900
    meter.set_rate(1.5, 3)  # no change
    meter.set_rate(1.5, 2)  # nodes changed, rate not (a free node): still a segment
    assert [(int(s.start_s), s.nodes, s.usd_per_hour) for s in meter.segments()] == [
        (0, 2, 1.0), (600, 3, 1.5), (1500, 2, 1.5)]
    meter.align(7200)  # adopted: the stack is two hours old
    assert meter.segments() == (Segment(7200, 2, 1.5),)
    now[0] += 60
    meter.set_rate(3.0, 4)
    assert meter.segments()[-1] == Segment(7260, 4, 3.0)


def test_placement_says_how_many_spot_nodes_fell_back_on_demand() -> None:
    assert placement_tags("g6.xlarge", "us-east-1", ["us-east-1b", "", "us-east-1a"],
                          "spot", 1, 4) == {
        "instance_type": "g6.xlarge", "region": "us-east-1", "zones": "us-east-1a,us-east-1b",
        "market": "spot, 1 of 4 on-demand"}
    assert placement_tags("local", "local", [], "on-demand")["market"] == "on-demand"


def test_update_messages_name_their_actor_once() -> None:
    assert with_actor("skyward: pool closed", "ana@box", "self-declared") == \
        "skyward: pool closed (actor: ana@box, self-declared)"
    assert with_actor("skyward: bring up 2 node(s)", ARN, "aws-sts") == \
        f"skyward: bring up 2 node(s) (actor: {ARN})"
    forced = "skyward-iac down --force by bo@b: load test over"
    assert with_actor(forced, "bo@b", "self-declared") == forced
    assert actor_of({"owner": "ana@box"}) == ("ana@box", "self-declared")
    assert actor_of({"owner": "ana@box", "actor": ARN, "actor_source": "aws-sts"}) == (ARN,
                                                                                      "aws-sts")


def test_the_aws_actor_is_the_sts_caller_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    for variable, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_SESSION_TOKEN": "testing", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(cloud_identity, "_actors", {})
    assert cloud_identity.known_actor("aws")[1] == "self-declared"  # not asked yet: no lookup
    with mock_aws():
        who, source = cloud_identity.actor("aws")
    assert source == "aws-sts" and who.startswith("arn:aws:") and "123456789012" in who
    assert cloud_identity.actor("aws") == (who, source)  # remembered: moto is gone now
    assert cloud_identity.known_actor("aws") == (who, source)
    assert cloud_identity.actor("local")[1] == "self-declared"


def test_the_gcp_actor_is_the_credentials_account(tmp_path: Path) -> None:
    key = tmp_path / "key.json"
    key.write_text(json.dumps({"type": "service_account",
                               "client_email": "ci@proj.iam.gserviceaccount.com"}))
    assert cloud_identity.gcp_account({"GOOGLE_APPLICATION_CREDENTIALS": str(key)}) == (
        "ci@proj.iam.gserviceaccount.com", "gcp-service-account")
    gcloud = tmp_path / "gcloud"
    (gcloud / "configurations").mkdir(parents=True)
    (gcloud / "configurations" / "config_default").write_text(
        "[core]\naccount = ana@example.com\nproject = p\n")
    assert cloud_identity.gcp_account({"CLOUDSDK_CONFIG": str(gcloud)}) == (
        "ana@example.com", "gcloud-account")
    assert cloud_identity.gcp_account({"CLOUDSDK_CONFIG": str(tmp_path / "none")}) is None


def update(kind: str, result: str, message: str, start: datetime,
           seconds: float) -> SimpleNamespace:
    return SimpleNamespace(kind=kind, result=result, message=message, start_time=start,
                           end_time=start + timedelta(seconds=seconds))


T0 = datetime(2026, 11, 1, 10, 0, tzinfo=UTC)
TAGS = {"created_at": T0.isoformat(), "owner": "ana@box", "provider": "aws", "nodes": "1",
        "usd_per_hour": "2.0000", "instance_type": "g6.xlarge", "region": "us-east-1",
        "zones": "us-east-1a", "market": "spot", "tag.team": "ml",
        SEGMENTS: "0:2:4 1800:1:2"}


def test_a_runs_summary_integrates_its_segments_and_keeps_failed_destroys() -> None:
    updates = [  # newest first
        update("destroy", "succeeded", "skyward gc: owner gone (actor: gc@ops)", T0
               + timedelta(hours=2), 60),
        update("destroy", "failed", "skyward: pool closed (actor: ana@box)", T0
               + timedelta(hours=1), 5),
        update("update", "succeeded", "skyward: bring up 2 node(s)", T0, 60)]
    run = runs.summary("aws-ana-1", TAGS, 0, updates, now=T0 + timedelta(days=9))
    assert run["duration_s"] == 2 * 3600 + 60
    assert run["node_hours"] == pytest.approx(2 * 0.5 + 1 * (1.5 + 60 / 3600), abs=1e-4)
    assert run["cost_usd"] == pytest.approx(4 * 0.5 + 2 * (1.5 + 60 / 3600), abs=1e-4)
    assert run["ended"].startswith("skyward gc:") and run["result"] == "succeeded"
    assert [d["result"] for d in run["destroys"]] == ["succeeded", "failed"]
    assert run["zones"] == ["us-east-1a"] and run["tags"] == {"team": "ml"}
    assert [s["at"] for s in run["segments"]] == ["2026-11-01T10:00:00+00:00",
                                                  "2026-11-01T10:30:00+00:00"]
    live = runs.summary("aws-ana-1", TAGS, 3, updates[2:], now=T0 + timedelta(hours=1))
    assert live["ended"] == "running" and live["node_hours"] == pytest.approx(1.5)


def test_the_cost_report_groups_and_windows_runs() -> None:
    rows = [{"created_at": "2026-10-31T23:00:00+00:00", "actor": "ana@box", "tags": {"team": "ml"},
             "instance_type": "g6.xlarge", "provider": "aws", "node_hours": 2.0, "cost_usd": 4.0},
            {"created_at": "2026-11-02T00:00:00+00:00", "actor": "bo@lap", "tags": {},
             "instance_type": "local", "provider": "local", "node_hours": 1.0, "cost_usd": 0.0},
            {"created_at": "2026-11-03T00:00:00+00:00", "actor": "ana@box",
             "tags": {"team": "ml", "cc": "c1"}, "instance_type": "g6.xlarge",
             "provider": "aws", "node_hours": 3.0, "cost_usd": 6.0}]
    by_user = cost.report(rows, "user")
    assert [(r.group, r.runs, r.cost_usd) for r in by_user] == [("ana@box", 2, 10.0),
                                                                ("bo@lap", 1, 0.0)]
    assert [r.group for r in cost.report(rows, "month")] == ["2026-11", "2026-10"]
    assert {r.group: r.runs for r in cost.report(rows, "tag:team")} == {"ml": 2, "(none)": 1}
    assert {r.group for r in cost.report(rows, "tag")} == {"team=ml", "cc=c1", "(none)"}
    november = cost.report(rows, "instance_type", cost.parse_time("2026-11", "--since"),
                           cost.parse_time("2026-11-03", "--until"))
    assert [(r.group, r.runs) for r in november] == [("local", 1)]
    assert cost.total(by_user, 3).cost_usd == 10.0
    with pytest.raises(Exception, match="give a month"):
        cost.parse_time("last tuesday", "--since")


def test_a_run_that_never_held_resources_uses_no_node_hours() -> None:
    """A plan's stack never applied, or an apply that failed before a node: no resources, no
    destroy. It stops counting at its last successful update, not at ``now``."""
    later = T0 + timedelta(days=3)
    planned = runs.summary("aws-ana-2", TAGS, 0, [], now=later)
    assert planned["ended"] == "never provisioned"
    assert planned["node_hours"] == 0 and planned["cost_usd"] == 0
    failed = runs.summary("aws-ana-3", TAGS, 0,
                          [update("update", "failed", "skyward: apply", T0, 9)], now=later)
    assert failed["node_hours"] == 0 and failed["duration_s"] == 0
    refreshed = runs.summary("aws-ana-4", TAGS, 0,  # its nodes vanished; a refresh saw it
                             [update("update", "succeeded", "skyward: up", T0, 3600)],
                             now=later)
    assert refreshed["duration_s"] == 3600 and refreshed["node_hours"] == pytest.approx(
        0.5 * 2 + 0.5 * 1, abs=1e-4)
