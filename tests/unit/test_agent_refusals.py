"""A flood of peers without the stack token costs the agent's log a bounded number of lines,
which still say how many connections were refused (issue 29, finding 7)."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

from skyward_iac.node import protocol
from skyward_iac.node.refusals import RefusalTally
from tests.agent_process import running_agent, wait_until

FLOOD = 600
EVERY = 1.0


# ---- the policy, on its own clock ------------------------------------------------------------

def test_the_first_refusal_is_said_at_once_the_rest_once_per_interval() -> None:
    tally = RefusalTally(every=60)
    first = tally.refused("127.0.0.1", now=0)
    assert first is not None and "rejected a connection" in first and "127.0.0.1" in first
    assert all(tally.refused("127.0.0.1", now=t / 100) is None for t in range(1, 3000))
    assert tally.summary(now=59) is None  # not due yet
    line = tally.summary(now=60)
    assert line == ("refused 2999 connection(s) without the stack token from 127.0.0.1 "
                    "in the last 60 s")
    assert tally.summary(now=61) is None and tally.refused("10.0.0.9", now=70) is None
    assert tally.summary(now=120) is not None  # the spell goes on: summed up, not said alone
    assert tally.summary(now=180) is None  # a quiet interval ends the spell...
    assert tally.refused("127.0.0.1", now=200) is not None  # ...and the next one is said again


def test_a_summary_names_a_few_peers_and_counts_the_others() -> None:
    tally = RefusalTally(every=10)
    tally.refused("a", now=0)
    for peer in ("a", "b", "b", "c", "d", "e"):
        tally.refused(peer, now=1)
    line = tally.summary(now=10)
    assert line is not None and line.startswith("refused 6 connection(s)")
    assert "from b, " in line and "and 2 other peer(s)" in line


def test_flush_says_what_is_counted() -> None:
    tally = RefusalTally(every=60)
    tally.refused("x", now=0)
    assert tally.flush() is None
    tally.refused("x", now=1)
    assert tally.flush() == ("refused 1 connection(s) without the stack token from x "
                             "since the last line")
    assert tally.flush() is None


# ---- a real agent under a flood --------------------------------------------------------------

def refused_in(log: str) -> int:
    """How many refusals the agent's log accounts for."""
    single = log.count("rejected a connection without the stack token")
    summed = sum(int(n) for n in re.findall(r"refused (\d+) connection\(s\)", log))
    return single + summed


def bad_peer(port: int, count: int) -> None:
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(protocol.HEADER.pack(5, protocol.RAW) + b"wrong")
            sock.settimeout(10)
            try:
                sock.recv(1)  # the agent closes it
            except ConnectionResetError:
                pass


def test_a_flood_of_bad_peers_logs_a_few_lines_that_count_them(tmp_path: Path) -> None:
    with running_agent(tmp_path, "--refusals-every", str(EVERY)) as agent:
        started = time.monotonic()
        peers = [threading.Thread(target=bad_peer, args=(agent.port, FLOOD // 4))
                 for _ in range(4)]
        for peer in peers:
            peer.start()
        for peer in peers:
            peer.join(120)
        log_file = agent.workdir / "agent.log"
        assert wait_until(lambda: refused_in(log_file.read_text()) >= FLOOD, 10 * EVERY), \
            log_file.read_text()[-2000:]
        took = time.monotonic() - started
        lines = [line for line in log_file.read_text().splitlines()
                 if "rejected" in line or "refused" in line]
    assert refused_in("\n".join(lines)) == FLOOD  # every refusal counted, once
    # One line at once, then at most one per interval (and one for a partial last interval).
    assert len(lines) <= 2 + took / EVERY, lines
    assert len(lines) < FLOOD / 20, lines
    assert "rejected a connection without the stack token from 127.0.0.1" in lines[0]
