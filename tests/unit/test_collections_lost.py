"""``CollectionsLost``: what the user is told when the head's etcd is gone, and where."""

from __future__ import annotations

import io

import pytest

import skyward_iac as sky
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.console_log import LogConsole, MinimalConsole
from skyward_iac.orchestration.collections import lost_message
from skyward_iac.remote.forward import Trouble

S = "local-root-20260101-000000-abcdef"


@pytest.mark.parametrize(("trouble", "why", "after"), [
    (Trouble.REFUSED, "etcd on the head node stopped", "until the pool closes"),
    (Trouble.SSH_LOST, "the SSH connection to the head node was lost (reset by peer)",
     "a new head node starts with empty collections"),
    (None, "the head node was replaced", "a new head node starts with empty collections"),
])
def test_the_message_says_what_is_lost_why_and_what_follows(trouble: Trouble | None, why: str,
                                                            after: str) -> None:
    message = lost_message(trouble, "reset by peer")
    assert message.startswith(f"the distributed collections are lost: {why}")
    assert "Every dict, set, counter, queue, lock and barrier of this pool, with its data, " \
           "is gone" in message
    assert "raise CollectionError" in message and message.endswith(after)


@pytest.mark.parametrize("console", [LogConsole, MinimalConsole])
def test_every_console_shows_it_once_as_an_error(console: type[LogConsole]) -> None:
    stream = io.StringIO()
    bus, errors = EventBus(), list[sky.Event]()
    console(stream).start(bus)
    bus.subscribe(errors.append, sky.Error)
    bus.emit(sky.CollectionsLost(stack=S, message=lost_message(Trouble.REFUSED, ""), node=0))
    assert len(errors) == 1 and not errors[0].fatal
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert " ERROR node 0: the distributed collections are lost: etcd on the head node " \
           "stopped" in lines[0]
