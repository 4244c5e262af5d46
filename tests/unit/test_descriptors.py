"""A pool makes room for its connections in the process's open-file limit (never past the hard
one), so a 1,000-node pool does not run out at a default soft limit of 1,024."""

from __future__ import annotations

import resource
import subprocess
import sys

from skyward_iac.orchestration import descriptors

INFINITY = resource.RLIM_INFINITY


def test_the_soft_limit_is_raised_to_what_the_pool_needs_and_never_past_the_hard_one() -> None:
    need = descriptors.wanted(1000)
    assert need >= 3 * 1000
    assert descriptors.raised_limit(1024, 1_048_576, need) == need
    assert descriptors.raised_limit(1024, 2048, need) == 2048  # what the hard limit allows
    assert descriptors.raised_limit(1024, INFINITY, need) == need
    assert descriptors.raised_limit(need, 1_048_576, need) is None  # room enough already
    assert descriptors.raised_limit(INFINITY, INFINITY, need) is None
    assert descriptors.raised_limit(4096, 4096, need) is None  # nothing more to give


def test_a_process_at_a_low_soft_limit_gets_room_for_a_thousand_nodes() -> None:
    code = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "from skyward_iac.orchestration import descriptors\n"
        "descriptors.make_room(1000)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    soft, hard = (int(value) for value in done.stdout.split())
    expected = descriptors.wanted(1000) if hard == INFINITY else min(descriptors.wanted(1000),
                                                                      hard)
    assert soft == max(256, expected)
