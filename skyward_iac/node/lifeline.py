"""A worker's lifeline to its agent: when the agent is gone, the worker stops at once (and with
it the agent's process group, the other workers and what tasks started), whichever notices
first, the lifeline or the worker's own connection."""

from __future__ import annotations

import os
import signal
import threading

#: A worker's exit status when its agent died before it.
ORPHANED = 70


def agent_gone(agent_group: int | None) -> None:
    """The agent is gone: stop this process, and with it the agent's process group (the other
    workers, the processes tasks started) when this worker belongs to ``agent_group``."""
    if agent_group is not None and os.getpgrp() == agent_group:
        os.killpg(agent_group, signal.SIGKILL)
    os._exit(ORPHANED)


def watch_lifeline(fd: int, agent_group: int | None) -> None:
    """Stop as soon as the agent is gone (end-of-file on the lifeline ``fd``)."""

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass  # the agent never writes; anything else than end-of-file is ignored
        except OSError:
            pass
        agent_gone(agent_group)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
