"""A ttl shorter than the bootstrap (issue 17 item 5): heartbeats start at the first SSH
contact, so a node whose bootstrap outlasts both its ttl and the watchdog's first-contact
grace is not stopped halfway, and the pool runs."""

from __future__ import annotations

import time

import skyward_iac as sky
from skyward_iac.infra.stacks.home import local_nodes_dir

#: The node's first-contact grace here (``sky.Local(first_contact_grace)``, 30 s by default):
#: short, so that outlasting it costs the suite seconds, not a minute.
GRACE = 6


@sky.function
def alive() -> str:
    return "alive"


def test_a_bootstrap_longer_than_ttl_and_the_grace_survives() -> None:
    slow = GRACE + 8  # seconds of bootstrap, past the grace and many ttls
    image = sky.Image(shell_vars={"SLOW_STEP": f"sleep {slow}; echo done"},
                      bootstrap_timeout=slow + 120)
    started = time.monotonic()
    with sky.Compute(provider=sky.Local(first_contact_grace=GRACE), ttl=3, image=image,
                     options=sky.Options(console=False)) as pool:
        assert time.monotonic() - started > slow  # the bootstrap really took that long
        watchdog = local_nodes_dir() / pool.stack_name / "node-0" / "log" / "watchdog.log"
        # The node was given this grace (and no longer one): the bootstrap outlasted it.
        assert f"({GRACE:g}s before the first)" in watchdog.read_text()
        assert alive() >> pool == "alive"
        time.sleep(4)  # beyond one ttl after bootstrap too: the heartbeat goes on
        assert alive() >> pool == "alive"
