"""Two machines, one S3 backend (moto): B's ``skyward-iac down`` of A's live pool is refused,
naming A's owner, host, lease and the command that forces it, and A's pool keeps working; a
forced takedown then goes through and says who did it and why, in ``history`` and in the
Pulumi update's message. "Machines" as in test_team_leases.py: two skyward homes, two
hostnames (``unshare --uts``), B with a user of its own (``USER``)."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from tests.integration.test_team_leases import (  # noqa: F401 - `shared` is a fixture
    shared,
    skyward_iac,
    start_owner,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a second hostname needs `unshare --uts`, which needs root")


@pytest.mark.timeout(600)
def test_a_teammates_down_of_a_live_pool_is_refused_until_forced(
        shared: dict[str, dict[str, str]]) -> None:  # noqa: F811
    # B's user is bo; A keeps the test's user (its Local node logs in over SSH as that user).
    a, b = shared["a"], {**shared["b"], "USER": "bo", "LOGNAME": "bo"}
    owner, lines, stack = start_owner(a)
    try:
        refused = skyward_iac(b, "machine-b", "down", stack)
        assert refused.returncode == 4, (refused.stdout, refused.stderr)
        for part in ("@machine-a (pid", "on machine-a)", "live lease",
                     "by this machine's clock",
                     f"skyward-iac down {stack} --force --reason"):
            assert part in refused.stderr, (part, refused.stderr)
        listed = skyward_iac(b, "machine-b", "ls", "--json")
        assert listed.returncode == 0, listed.stderr
        [row] = [r for r in json.loads(listed.stdout) if r["stack"] == stack]
        assert row["resources"] >= 2  # nothing of A's pool was touched
        assert owner.poll() is None, "A's pool was disturbed"
        assert not any(re.search(r"destroy|lost|replac|taken down", line) for line in lines), \
            lines[-5:]

        forced = skyward_iac(b, "machine-b", "down", stack, "--force", "--reason",
                             "load test over")
        assert forced.returncode == 0, forced.stderr
        history = skyward_iac(b, "machine-b", "history", "--json")
        assert history.returncode == 0, history.stderr
        [run] = [r for r in json.loads(history.stdout) if r["stack"] == stack]
        assert run["ended"] == ("skyward: destroyed by bo@machine-b: skyward-iac down --force: "
                                "load test over")
        assert run["live_resources"] == 0
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
        owner.wait(30)
        skyward_iac(a, "machine-a", "gc")  # whatever is left
