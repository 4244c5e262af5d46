"""A Ctrl+C while a ``sky.MultiPool`` provisions leaves none of its pools behind.

The pools come up in threads of their own and the Ctrl+C reaches the main thread only, so
``__exit__`` never runs: ``__enter__`` itself destroys every pool once they are up. A real
script, two 1-node Local pools, SIGINT during their ``pulumi up``."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from skyward_iac.infra.stacks.stack import ClusterStack
from tests.chaos.test_lifecycle_chaos import wait_until_gone
from tests.helpers import interrupted_script

pytestmark = pytest.mark.chaos
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import skyward_iac as sky
options = sky.Options(console="log")
with sky.MultiPool(sky.Compute(provider=sky.Local(), nodes=1, ttl=600, options=options),
                   sky.Compute(provider=sky.Local(), nodes=1, ttl=600, options=options)) as pools:
    print("UP", flush=True)
"""


def test_a_ctrl_c_while_a_multipool_provisions_destroys_every_pool() -> None:
    # Both stacks exist at the first `pulumi up` line; their nodes are being created.
    status, output = interrupted_script(["-u", "-c", SCRIPT], "pulumi up [", ROOT)
    stacks = set(re.findall(r"stack (\S+): requesting", output))
    assert status == -signal.SIGINT, output[-3000:]
    assert "UP" not in output.split()
    assert len(stacks) == 2, output[-3000:]
    for stack in stacks:
        wait_until_gone(stack, timeout=30)
        assert ClusterStack.select(stack).resource_count() == 0, output[-3000:]
