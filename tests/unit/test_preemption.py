"""The node-side preemption watcher against a real HTTP stand-in for the metadata servers."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from datetime import datetime

import pytest

from skyward_iac.node.preemption import PreemptionWatcher, aws_notice
from tests.fake_metadata import GCP_PREEMPTED, SPOT_ACTION, FakeMetadataServer


@pytest.fixture
def metadata() -> Iterator[FakeMetadataServer]:
    server = FakeMetadataServer(notice_time="2030-01-01T00:02:00Z")
    yield server
    server.close()


def watch(cloud: str, server: FakeMetadataServer) -> tuple[PreemptionWatcher, queue.Queue]:
    notices: queue.Queue[tuple[float, str]] = queue.Queue()
    watcher = PreemptionWatcher(cloud, lambda d, r: notices.put((d, r)),  # type: ignore[arg-type]
                                base_url=server.url, poll=0.05).start()
    return watcher, notices


def test_aws_notice_arrives_once_with_its_deadline(metadata: FakeMetadataServer) -> None:
    watcher, notices = watch("aws", metadata)
    try:
        with pytest.raises(queue.Empty):
            notices.get(timeout=0.5)  # nothing announced: 404s, no notice
        metadata.announce()
        deadline, reason = notices.get(timeout=5)
    finally:
        watcher.stop()
    assert deadline == datetime.fromisoformat("2030-01-01T00:02:00+00:00").timestamp()
    assert reason == "AWS spot interruption notice (terminate)"
    # IMDSv2: one token first, then the polls carry it (a 401 would have shown as no notice).
    assert metadata.requests[0] == ("PUT", "/latest/api/token")
    assert {r for r in metadata.requests[1:]} == {("GET", SPOT_ACTION)}
    assert notices.empty()


def test_gcp_notice_uses_the_hanging_get(metadata: FakeMetadataServer) -> None:
    watcher, notices = watch("gcp", metadata)
    try:
        with pytest.raises(queue.Empty):
            notices.get(timeout=0.3)
        metadata.announce()
        deadline, reason = notices.get(timeout=5)
    finally:
        watcher.stop()
    assert reason == "GCP preemption notice"
    paths = {path for method, path in metadata.requests}
    assert paths == {f"{GCP_PREEMPTED}?wait_for_change=true&timeout_sec=60"}


def test_an_unreachable_metadata_server_is_no_notice() -> None:
    notices: queue.Queue[tuple[float, str]] = queue.Queue()
    watcher = PreemptionWatcher("aws", lambda d, r: notices.put((d, r)),
                                base_url="http://127.0.0.1:9", poll=0.05).start()
    try:
        with pytest.raises(queue.Empty):
            notices.get(timeout=0.5)
    finally:
        watcher.stop()


def test_unreadable_aws_document_still_counts() -> None:
    assert aws_notice(b"garbage", now=100.0) == (220.0, "AWS spot interruption notice")


def test_unknown_cloud_is_refused() -> None:
    with pytest.raises(ValueError, match="no preemption notices for 'azure'"):
        PreemptionWatcher("azure", print)  # type: ignore[arg-type]
