"""A client whose clock is off, for the clock tests: it beats as clients did before issue 29,
stamping the heartbeat file's times over SFTP with its own clock (paramiko's
``sftp.utime(path, None)`` sends the client's ``time.time()``), here ``skew`` seconds off.
Today's client beats over the agent connection once a node is attached, which carries no time
of the client's at all: so the old client also keeps beating over SFTP (``OLD_CLIENT``: no hand
over to the agent, no SSH connection released).

The skew is injected where the client stamps its beat, rather than with libfaketime around the
client: the engine's provider host inherits a preloaded library from the client and starts the
Local nodes' watchdogs, which would then share the client's skew and hide it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from skyward_iac.orchestration import heartbeat
from skyward_iac.remote.node_ssh import NodeSsh

#: What makes a client beat over SFTP for a node's whole life, as before issue 32:
#: ``(owner, attribute, replacement)``.
OLD_CLIENT: tuple[tuple[Any, str, Any], ...] = (
    (heartbeat.Heartbeat, "attached", lambda self, index, connection, agent: None),
    (NodeSsh, "release", lambda self: None),
)


def stamp_like_the_old_client(skew: float) -> Callable[[Any, str, int], None]:
    """A ``heartbeat._write_beat`` that stamps ``path`` with this machine's time plus ``skew``."""

    def beat(sftp: Any, path: str, count: int) -> None:
        moment = time.time() + skew
        try:
            sftp.utime(path, (moment, moment))
        except FileNotFoundError:
            sftp.open(path, "a").close()
            sftp.utime(path, (moment, moment))

    return beat


def skew_the_beats(skew: float) -> None:
    """Make this process's heartbeats carry a clock ``skew`` seconds off, over SFTP."""
    heartbeat._write_beat = stamp_like_the_old_client(skew)  # type: ignore[assignment]
    for owner, name, replacement in OLD_CLIENT:
        setattr(owner, name, replacement)
