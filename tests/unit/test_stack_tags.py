"""The order in which a new stack's tags are written: what gc decides on before any `up`,
the labels beside it, and nothing written over them while they are still going in."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.infra import stack as stack_module
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.tags import GC_TAGS, TAG_PREFIX, encode_tags


class SlowLabels:
    """A stack whose label tags (not gc's) take until ``release`` is set to write."""

    name = "local-tags"

    def __init__(self) -> None:
        self.written: list[str] = []
        self.release = threading.Event()

    def set_tag(self, key: str, value: str) -> None:
        if key.removeprefix(TAG_PREFIX) not in GC_TAGS:
            assert self.release.wait(10), "the label writer was never let through"
        self.written.append(key.removeprefix(TAG_PREFIX))


def test_gc_tags_are_in_before_create_returns_and_later_writes_wait_for_the_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = SlowLabels()
    monkeypatch.setattr(stack_module, "_workspace", lambda *_: None)
    monkeypatch.setattr(stack_module.LeanStack, "create", lambda _name, _workspace: fake)
    tags = {"owner": "me@here", "provider": "local", "lease_until": "2026-11-25T00:10:00+00:00",
            "created_at": "2026-11-25T00:00:00+00:00", "pid": "42"}
    request = ClusterRequest("local-tags", sky.Spec(provider=sky.Local()), 1)

    handle = stack_module.ClusterStack.create(request, tags)
    # gc can already decide (created_at, host and pid are in `run`); the labels still wait.
    assert sorted(fake.written) == sorted(GC_TAGS)

    renewal = threading.Thread(target=handle.renew_lease, args=("2026-11-25T00:20:00+00:00",))
    renewal.start()
    renewal.join(0.3)
    assert renewal.is_alive(), "a renewal must wait for the labels being written"
    fake.release.set()
    renewal.join(10)
    labels = [key for key in encode_tags(tags) if key not in GC_TAGS]
    assert fake.written[2:] == [*labels, "lease_until"]


def test_a_failed_label_write_is_a_warning_not_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    from pulumi.automation.errors import CommandError

    class Refusing(SlowLabels):
        def set_tag(self, key: str, value: str) -> None:
            if key == TAG_PREFIX + "owner":
                raise CommandError("code: 255\n stderr: the backend said no")
            self.written.append(key.removeprefix(TAG_PREFIX))

    fake: Any = Refusing()
    monkeypatch.setattr(stack_module, "_workspace", lambda *_: None)
    monkeypatch.setattr(stack_module.LeanStack, "create", lambda _name, _workspace: fake)
    handle = stack_module.ClusterStack.create(
        ClusterRequest("local-tags", sky.Spec(provider=sky.Local()), 1),
        {"owner": "me@here", "provider": "local", "created_at": "2026-11-25T00:00:00+00:00"})
    handle.mark_taken_down("ops@there")
    assert fake.written == ["run", "provider", "down_by"]
    assert "tag owner not written" in caplog.text
