"""Reading a Pulumi S3 backend's records straight from its objects (``engine/state_s3.py``), on
moto's in-process S3 with objects laid out as pulumi's DIY backend writes them: what is read,
what a second look reads again (only what changed), and when the engine must read instead."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from skyward_iac.infra.engine import state_s3
from skyward_iac.infra.engine.state_cache import StateCache

BUCKET = "team-state"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from moto import mock_aws

    for variable, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(state_s3, "_clients", {})
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def put(client: Any, key: str, value: Any, zipped: bool = False) -> None:
    body = json.dumps(value).encode()
    client.put_object(Bucket=BUCKET, Key=key, Body=gzip.compress(body) if zipped else body)


def record_run(client: Any, name: str, live: bool, prefix: str = "",
               destroyed: bool = True) -> None:
    """A stack as the engine leaves it: checkpoint (+ backup), tags, two history records."""
    resources = [{"type": "pulumi:pulumi:Stack"}, {"type": "pulumi:providers:x"},
                 {"type": "pulumi-python:dynamic:Resource"}] if live else []
    put(client, f"{prefix}.pulumi/stacks/skyward/{name}.json",
        {"version": 3, "checkpoint": {"latest": {"resources": resources}}})
    put(client, f"{prefix}.pulumi/stacks/skyward/{name}.json.bak", {"version": 3})
    put(client, f"{prefix}.pulumi/stacks/skyward/{name}.pulumi-tags",
        {"version": 1, "tags": {"skyward:owner": "ana@box", "skyward:run":
                                '{"created_at":"2026-11-01T10:00:00+00:00"}'}})
    history = f"{prefix}.pulumi/history/skyward/{name}/{name}"
    put(client, f"{history}-100.history.json",
        {"kind": "update", "result": "succeeded", "message": "skyward: bring up 1 node(s)",
         "startTime": 1_700_000_000, "endTime": 1_700_000_060, "config": {"x": {"secure": "c"}}})
    put(client, f"{history}-100.checkpoint.json", {"version": 3})
    if destroyed and not live:
        put(client, f"{history}-200.history.json.gz",
            {"kind": "destroy", "result": "succeeded", "message": "skyward: pool closed",
             "startTime": 1_700_003_600, "endTime": 1_700_003_660}, zipped=True)


def layout(client: Any, prefix: str = "") -> None:
    client.put_object(Bucket=BUCKET, Key=f"{prefix}.pulumi/meta.yaml", Body=b"version: 1\n")


def counting(client: Any) -> dict[str, int]:
    """Requests of each kind ``client`` makes from now on."""
    counts: dict[str, int] = {}

    def count(model: Any, **_: Any) -> None:
        counts[model.name] = counts.get(model.name, 0) + 1

    client.meta.events.register("before-call.s3", count)
    return counts


def test_the_url_settings_are_the_engines(tmp_path: Path) -> None:
    where = state_s3.location("s3://team-state/ml/runs?endpoint=127.0.0.1:9000&disableSSL=true"
                              "&s3ForcePathStyle=true&region=eu-west-1&awssdk=v2")
    assert where == state_s3.Location("team-state", "ml/runs/", "eu-west-1",
                                      "http://127.0.0.1:9000", None, True)
    assert state_s3.location("s3://b?endpoint=https://minio:9000&profile=ops").endpoint == \
        "https://minio:9000"
    assert state_s3.location("s3://b?endpoint=minio:9000").endpoint == "https://minio:9000"
    for unknown in ("s3://b?role=arn:aws:iam::1:role/r", "gs://b", "file:///x", "s3://"):
        assert state_s3.location(unknown) is None, unknown


def test_stacks_tags_counts_and_histories_are_read(s3: Any, tmp_path: Path) -> None:
    layout(s3)
    record_run(s3, "local-ana-1", live=False)
    record_run(s3, "local-ana-2", live=True)
    stacks = state_s3.read_stacks(f"s3://{BUCKET}", "skyward", tmp_path / "c.json",
                                  updates=True)
    assert stacks is not None
    by_name = {s.name: s for s in stacks}
    assert set(by_name) == {"local-ana-1", "local-ana-2"}  # no .bak, no checkpoint copies
    assert by_name["local-ana-2"].resource_count == 1  # the stack and providers left out
    assert by_name["local-ana-1"].tags["skyward:owner"] == "ana@box"
    ended = by_name["local-ana-1"].updates
    assert [(u.kind, u.message) for u in ended] == [("destroy", "skyward: pool closed"),
                                                    ("update", "skyward: bring up 1 node(s)")]
    assert "secure" not in (tmp_path / "c.json").read_text()  # no config in the cache
    assert (tmp_path / "c.json").stat().st_mode & 0o777 == 0o600


def test_a_second_look_reads_only_what_changed(s3: Any, tmp_path: Path) -> None:
    layout(s3)
    for index in range(5):
        record_run(s3, f"local-ana-{index}", live=index == 0)
    cache = tmp_path / "c.json"
    url = f"s3://{BUCKET}"
    first = state_s3.read_stacks(url, "skyward", cache, updates=True)
    client = state_s3._clients[state_s3.location(url)]
    counts = counting(client)
    again = state_s3.read_stacks(url, "skyward", cache, updates=True)
    assert again == first
    # meta.yaml, the stacks listing, and the live stack's history listing; nothing else.
    assert counts == {"GetObject": 1, "ListObjectsV2": 2}, counts
    put(s3, ".pulumi/stacks/skyward/local-ana-3.pulumi-tags",
        {"version": 1, "tags": {"skyward:owner": "bo@lap"}})
    counts.clear()
    changed = state_s3.read_stacks(url, "skyward", cache, updates=True)
    assert {s.name: s.tags for s in changed or []}["local-ana-3"] == {"skyward:owner": "bo@lap"}
    assert counts == {"GetObject": 2, "ListObjectsV2": 2}, counts
    # A removed stack's summaries leave the cache with it.
    for key in ("json", "json.bak", "pulumi-tags"):
        s3.delete_object(Bucket=BUCKET, Key=f".pulumi/stacks/skyward/local-ana-4.{key}")
    state_s3.read_stacks(url, "skyward", cache, updates=True)
    assert "local-ana-4" not in cache.read_text()


def test_a_history_that_may_still_grow_is_listed_again(s3: Any, tmp_path: Path) -> None:
    layout(s3)
    record_run(s3, "local-ana-1", live=False, destroyed=False)  # emptied, destroy not recorded
    url, cache = f"s3://{BUCKET}", tmp_path / "c.json"
    state_s3.read_stacks(url, "skyward", cache, updates=True)
    put(s3, ".pulumi/history/skyward/local-ana-1/local-ana-1-200.history.json",
        {"kind": "destroy", "result": "succeeded", "message": "late",
         "startTime": 1_700_003_600, "endTime": 1_700_003_660})
    [stack] = state_s3.read_stacks(url, "skyward", cache, updates=True) or []
    assert stack.updates[0].message == "late"


def test_a_prefix_in_the_url_is_the_backends_root(s3: Any, tmp_path: Path) -> None:
    layout(s3, "teams/ml/")
    record_run(s3, "local-ana-1", live=False, prefix="teams/ml/")
    record_run(s3, "local-other-1", live=False)  # another backend in the same bucket
    stacks = state_s3.read_stacks(f"s3://{BUCKET}/teams/ml", "skyward", None)
    assert [s.name for s in stacks or []] == ["local-ana-1"]


def test_what_this_reader_cannot_read_goes_to_the_engine(s3: Any, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}"
    assert state_s3.read_stacks(url, "skyward", None) is None  # no meta.yaml: not known
    s3.put_object(Bucket=BUCKET, Key=".pulumi/meta.yaml", Body=b"version: 0\n")
    assert state_s3.read_stacks(url, "skyward", None) is None  # the legacy layout
    layout(s3)
    record_run(s3, "local-ana-1", live=False)
    s3.put_object(Bucket=BUCKET, Key=".pulumi/stacks/skyward/local-ana-2.json.zst", Body=b"z")
    assert state_s3.read_stacks(url, "skyward", None) is None  # zstd: the engine reads it
    assert state_s3.read_stacks("s3://no-such-bucket", "skyward", None) is None


def test_the_cache_ignores_a_changed_etag_and_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    cache = StateCache(path)
    cache.put("k", "e1", {"a": 1})
    cache.save(lambda key: True)
    again = StateCache(path)
    assert again.get("k", "e1") == {"a": 1} and again.get("k", "e2") is None
    path.write_text("{not json")
    assert StateCache(path).get("k", "e1") is None


def test_only_the_histories_asked_for_are_read(s3: Any, tmp_path: Path) -> None:
    """``history --limit N`` reads the histories of the newest N runs only."""
    layout(s3)
    for index in range(4):
        record_run(s3, f"local-ana-{index}", live=False)
    seen: list[list[str]] = []

    def pick(stacks: list[Any]) -> list[str]:
        seen.append([s.name for s in stacks])
        return ["local-ana-2"]

    stacks = state_s3.read_stacks(f"s3://{BUCKET}", "skyward", None, updates=pick) or []
    assert seen == [[f"local-ana-{index}" for index in range(4)]]
    assert [s.name for s in stacks if s.updates] == ["local-ana-2"]
    assert all(s.tags for s in stacks)


def test_many_histories_are_listed_in_one_sweep(s3: Any, tmp_path: Path) -> None:
    """A first look at many runs lists every history once, not each run's on its own."""
    layout(s3)
    runs = state_s3.SWEEP + 5
    for index in range(runs):
        record_run(s3, f"local-ana-{index:02d}", live=index == 0)
    url = f"s3://{BUCKET}"
    state_s3.read_stacks(url, "skyward", None)  # the client exists: count from here
    counts = counting(state_s3._clients[state_s3.location(url)])
    stacks = state_s3.read_stacks(url, "skyward", tmp_path / "c.json", updates=True) or []
    assert counts["ListObjectsV2"] == 2, counts  # the stacks, then every history
    assert all(len(s.updates) == (1 if s.resource_count else 2) for s in stacks)
    assert len(stacks) == runs


def test_a_listing_cut_where_the_last_one_paged_misses_nothing(
        s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages are listed at once from the last look's cuts; stacks added or removed since,
    before, between or after the cuts, are all seen."""
    monkeypatch.setattr(state_s3, "PAGE", 4)  # a page of 4 keys: many cuts on a few stacks
    layout(s3)
    for index in range(2, 20, 2):
        record_run(s3, f"local-ana-{index:02d}", live=False)
    url, cache = f"s3://{BUCKET}", tmp_path / "c.json"
    first = state_s3.read_stacks(url, "skyward", cache) or []
    assert len(first) == 9
    assert len(json.loads(cache.read_text())["splits"][".pulumi/stacks/skyward/"]) >= 5
    for index in (0, 7, 11, 21):
        record_run(s3, f"local-ana-{index:02d}", live=False)
    for key in ("json", "json.bak", "pulumi-tags"):
        s3.delete_object(Bucket=BUCKET, Key=f".pulumi/stacks/skyward/local-ana-08.{key}")
    counts = counting(state_s3._clients[state_s3.location(url)])
    again = state_s3.read_stacks(url, "skyward", cache) or []
    assert [s.name for s in again] == sorted(
        f"local-ana-{i:02d}" for i in (0, 2, 4, 6, 7, 10, 11, 12, 14, 16, 18, 21))
    assert counts["ListObjectsV2"] >= 6  # one per range, at once


def test_a_new_machine_takes_the_teams_shared_summaries(
        s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first look shares what it read in the backend; another machine's first look reads
    that one object instead of every run's, and what changed since is read again."""
    monkeypatch.setattr(state_s3, "SHARE", 2)
    layout(s3)
    for index in range(6):
        record_run(s3, f"local-ana-{index}", live=index == 0)
    url = f"s3://{BUCKET}"
    first = state_s3.read_stacks(url, "skyward", tmp_path / "a.json", updates=True)
    shared = s3.get_object(Bucket=BUCKET, Key=".skyward/listings/skyward.json.gz")["Body"].read()
    assert b"secure" not in gzip.decompress(shared)  # summaries only, no config
    put(s3, ".pulumi/stacks/skyward/local-ana-3.pulumi-tags",
        {"version": 1, "tags": {"skyward:owner": "bo@lap"}})
    counts = counting(state_s3._clients[state_s3.location(url)])
    second = state_s3.read_stacks(url, "skyward", tmp_path / "b.json", updates=True) or []
    # meta.yaml, the shared summaries and the changed tags; the stacks and the live history
    # listed: no other run's object read again.
    assert counts == {"GetObject": 3, "ListObjectsV2": 2}, counts
    assert {s.name: s.tags for s in second}["local-ana-3"] == {"skyward:owner": "bo@lap"}
    assert [s for s in second if s.name != "local-ana-3"] == \
        [s for s in first or [] if s.name != "local-ana-3"]


def test_shared_summaries_that_are_not_a_cache_are_ignored(
        s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_s3, "SHARE", 2)
    layout(s3)
    for index in range(4):
        record_run(s3, f"local-ana-{index}", live=False)
    url = f"s3://{BUCKET}"
    expected = state_s3.read_stacks(url, "skyward", None, updates=True)
    for body in (b"not gzip", gzip.compress(b"{not json"), gzip.compress(b'{"version": 99}')):
        s3.put_object(Bucket=BUCKET, Key=".skyward/listings/skyward.json.gz", Body=body)
        assert state_s3.read_stacks(url, "skyward", tmp_path / "c.json", updates=True) \
            == expected
        (tmp_path / "c.json").unlink()


def test_a_history_that_ends_in_a_destroy_spares_the_checkpoint(s3: Any, tmp_path: Path) -> None:
    """A stack whose checkpoint is the copy its destroy left is empty without reading it; one
    written since (another ETag), or left by a destroy that spared resources, is read."""
    layout(s3)
    for name in ("local-ana-1", "local-ana-2"):
        record_run(s3, name, live=False)
        put(s3, f".pulumi/history/skyward/{name}/{name}-200.checkpoint.json.gz",
            {"version": 3, "checkpoint": {"latest": {"resources": []}}}, zipped=False)
    # local-ana-2 was written since its destroy: a resource the history does not know of.
    put(s3, ".pulumi/stacks/skyward/local-ana-2.json", {"version": 3, "checkpoint": {
        "latest": {"resources": [{"type": "pulumi-python:dynamic:Resource"}]}}})
    # local-ana-3's destroy was targeted (`pulumi destroy --target`): it spared resources.
    record_run(s3, "local-ana-3", live=False)
    history = ".pulumi/history/skyward/local-ana-3/local-ana-3-200"
    put(s3, f"{history}.history.json.gz", {
        "kind": "destroy", "result": "succeeded", "message": "partial",
        "startTime": 1_700_003_600, "endTime": 1_700_003_660,
        "environment": {"pulumi.flag.target": "set"}, "resourceChanges": {"delete": 1}},
        zipped=True)
    put(s3, f"{history}.checkpoint.json.gz", {"version": 3, "checkpoint": {"latest": {}}})
    put(s3, ".pulumi/stacks/skyward/local-ana-3.json", {"version": 3, "checkpoint": {"latest": {}}})
    url = f"s3://{BUCKET}"
    state_s3.read_stacks(url, "skyward", None)  # the client exists: count from here
    read: list[str] = []
    client = state_s3._clients[state_s3.location(url)]
    client.meta.events.register("before-parameter-build.s3.GetObject",
                                lambda params, **_: read.append(params["Key"]))
    stacks = {s.name: s for s in state_s3.read_stacks(url, "skyward", None, updates=True) or []}
    assert stacks["local-ana-1"].resource_count == 0
    assert stacks["local-ana-2"].resource_count == 1
    assert ".pulumi/stacks/skyward/local-ana-1.json" not in read
    assert ".pulumi/stacks/skyward/local-ana-2.json" in read
    assert ".pulumi/stacks/skyward/local-ana-3.json" in read
