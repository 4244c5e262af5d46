"""The cloud nodes' dead-man switch, run for real: the bash script cloud-init installs, with
fake ``systemctl``/``logger`` that record what it asked for. It judges silence on its own clock
(``/proc/uptime``) from the changes it sees, the Local watchdog's rule: the times a client
stamps on the heartbeat file, right or 120 s off either way, change nothing."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from skyward_iac.infra.programs.cloud_init import gce_self_delete, watchdog_script


class Watchdog:
    """The real script on ``tmp_path``: its heartbeat file, its state file, its calls."""

    def __init__(self, tmp_path: Path, **kw: Any) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        self.calls = tmp_path / "calls"
        # Each call with this machine's monotonic time, to say when the script fired.
        fake = ('#!/bin/bash\nread -r up _ < /proc/uptime\n'
                f'echo "$up $(basename "$0") $*" >> {self.calls}\n')
        (bin_dir / "logger").write_text(fake)
        (bin_dir / "systemctl").write_text(fake + "kill $PPID\n")  # a real poweroff ends it too
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
        self.heartbeat, self.state = tmp_path / "heartbeat", tmp_path / "state"
        self.budget = tmp_path / "budget"
        self.script = tmp_path / "watchdog"
        self.script.write_text(watchdog_script(heartbeat=str(self.heartbeat), state=str(self.state),
                                               budget=str(self.budget), interval=0.1, **kw))
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Watchdog:
        self.process = subprocess.Popen(["bash", str(self.script)], env=self.env,
                                        stdin=subprocess.DEVNULL)
        return self

    def wait(self, seconds: float) -> str:
        """Let it run up to ``seconds`` (it ends itself when it powers off); its calls."""
        assert self.process is not None
        try:
            self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.calls.read_text() if self.calls.exists() else ""

    def fired_at(self) -> float | None:
        """When (uptime) it first asked to power off, or None."""
        text = self.calls.read_text() if self.calls.exists() else ""
        return next((float(line.split()[0]) for line in text.splitlines()
                     if "systemctl poweroff" in line), None)


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def stamp(path: Path, skew: float) -> None:
    """One beat as the old client sent it: the file's times set to *its* clock, ``skew`` off."""
    path.touch()
    moment = time.time() + skew
    os.utime(path, (moment, moment))


def test_silence_of_ttl_after_the_last_change_powers_off(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=1, grace=1)
    stamp(dog.heartbeat, -5)  # there before the watchdog: not a beat
    calls = dog.start().wait(6)
    assert "systemctl poweroff" in calls and "no heartbeat for 1s" in calls


def test_before_the_first_beat_the_grace_counts_from_the_watchdogs_start(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=1, grace=2)
    started = uptime()
    calls = dog.start().wait(8)
    assert "no heartbeat for 2s" in calls
    assert (dog.fired_at() or 0) - started >= 2  # the grace, not the ttl


def test_a_node_with_fresh_beats_is_kept(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=60, grace=60)
    stamp(dog.heartbeat, 0)
    assert dog.start().wait(0.6) == ""
    assert dog.state.read_text().split()[2] == "0"  # its state is kept for a restart


def test_max_lifetime_whatever_the_heartbeat(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=60, grace=60, max_lifetime=1)
    stamp(dog.heartbeat, 0)
    calls = dog.start().wait(6)
    assert "max lifetime 1s reached" in calls and "systemctl poweroff" in calls


@pytest.mark.parametrize("skew", [-120.0, 120.0])
def test_a_client_clock_120s_off_neither_fires_early_nor_late(tmp_path: Path,
                                                              skew: float) -> None:
    """The finding: stamps 120 s behind made a ttl=30 pool's nodes stop again and again;
    120 s ahead fired after 140 s instead of 20. Here the stamps come every 0.2 s for 3 s
    (three ttls) and the node stays; after the last it powers off about a ttl later."""
    dog = Watchdog(tmp_path, ttl=1, grace=1)
    stamp(dog.heartbeat, skew)
    dog.start()
    end = time.monotonic() + 3
    while time.monotonic() < end:
        stamp(dog.heartbeat, skew)
        last_beat = uptime()
        time.sleep(0.2)
    assert dog.fired_at() is None, "it fired while the beats came"
    dog.wait(15)
    fired = dog.fired_at()
    assert fired is not None, "it never fired after the beats stopped"
    # ttl 1 s after the last beat (uptime counts in hundredths), looking every 0.1 s.
    assert 0.99 <= fired - last_beat <= 6, fired - last_beat


def test_a_restarted_watchdog_grants_no_fresh_grace(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=1, grace=30)
    # What an earlier run of it saw: started 40 s ago, never a beat.
    ago = int((uptime() - 40) * 100)
    dog.state.write_text(f"{ago} {ago} 0\nnone\n")
    calls = dog.start().wait(6)
    assert "no heartbeat for 30s" in calls  # not 30 s from this start


def test_a_damaged_state_starts_afresh_instead_of_stopping_the_watchdog(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=60, grace=60)
    dog.state.write_text("garbage\n")
    dog.start()
    time.sleep(0.6)
    assert dog.process is not None and dog.process.poll() is None, "the watchdog died"
    dog.wait(0)
    started, changed, beaten = dog.state.read_text().split()[:3]
    assert started.isdigit() and changed == started and beaten == "0"


def test_gce_watchdog_deletes_its_own_instance_before_powering_off(tmp_path: Path) -> None:
    """The GCP fire path, run for real against a local server that speaks the metadata and
    Compute API paths: the token from the metadata server goes with one DELETE of this very
    instance, then the power-off (which also stays the fallback when the API says no)."""
    seen: list[tuple[str, str, str | None]] = []

    class Fake(http.server.BaseHTTPRequestHandler):
        answers = {"/md/instance/service-accounts/default/token":
                   '{"access_token": "ya29.tok", "expires_in": 3599, "token_type": "Bearer"}',
                   "/md/instance/name": "gcp-x-node-1", "/md/project/project-id": "proj",
                   "/md/instance/zone": "projects/123/zones/us-central1-a"}

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(("GET", self.path, self.headers.get("Metadata-Flavor")))
            body = self.answers[self.path].encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def do_DELETE(self) -> None:  # noqa: N802
            seen.append(("DELETE", self.path, self.headers.get("Authorization")))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        dog = Watchdog(tmp_path, ttl=1, grace=1,
                       before_stop=gce_self_delete(f"{base}/md", f"{base}/api"))
        calls = dog.start().wait(10)
    finally:
        server.shutdown()
    assert ("DELETE", "/api/projects/proj/zones/us-central1-a/instances/gcp-x-node-1",
            "Bearer ya29.tok") in seen
    assert all(flavor == "Google" for method, _, flavor in seen if method == "GET")
    assert "deleting instance gcp-x-node-1" in calls and "systemctl poweroff" in calls
    assert calls.index("deleting instance") < calls.index("systemctl poweroff")


def beat_until(dog: Watchdog, seconds: float) -> None:
    """Beat every 0.2 s for ``seconds`` (or until it powered off): a live client."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and dog.fired_at() is None:
        stamp(dog.heartbeat, 0)
        time.sleep(0.2)


def test_the_budgets_seconds_count_from_when_it_sees_them_whatever_the_beats(
        tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=60, grace=60)
    dog.budget.write_text("none\n")  # no deadline (a pool without a budget)
    dog.start()
    beat_until(dog, 0.6)
    assert dog.fired_at() is None
    told = uptime()
    dog.budget.write_text("2\n")  # 2 s left at the pool's rate
    beat_until(dog, 10)
    fired = dog.fired_at()
    assert fired is not None, "it never powered off at the budget's deadline"
    assert 2.0 <= fired - told <= 4, fired - told  # a look (0.1 s) late at most, plus load
    assert "budget is spent" in dog.wait(1)


def test_a_new_note_moves_the_deadline_and_none_clears_it(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=60, grace=60)
    dog.budget.write_text("1\n")
    dog.start()
    time.sleep(0.4)
    dog.budget.write_text("")  # caught half written: changes nothing yet
    time.sleep(0.2)
    dog.budget.write_text("none\n")  # the pool got cheaper: no deadline now
    beat_until(dog, 2.0)
    assert dog.fired_at() is None, "a cleared budget still stopped the node"


def test_a_restarted_watchdog_keeps_the_budgets_deadline(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=60, grace=60)
    dog.budget.write_text("30\n")
    # What an earlier run saw: the note above, with a deadline already 1 s past.
    now = int(uptime() * 100)
    seen = subprocess.run(["stat", "-c", "%i %s %y %z", str(dog.budget)], capture_output=True,
                          text=True, check=True).stdout.strip()
    dog.state.write_text(f"{now} {now} 1\nnone\n{now - 100}\n{seen}\n")
    stamp(dog.heartbeat, 0)
    calls = dog.start().wait(6)
    assert "budget is spent" in calls  # not 30 s from this start


def test_a_state_from_before_budgets_starts_with_none(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, ttl=60, grace=60)
    now = int(uptime() * 100)
    dog.state.write_text(f"{now} {now} 1\nnone\n")  # an older watchdog's two lines
    stamp(dog.heartbeat, 0)
    dog.start()
    beat_until(dog, 0.6)
    assert dog.fired_at() is None and dog.process is not None and dog.process.poll() is None
    assert dog.state.read_text().splitlines()[2] == "-1"  # kept as no deadline
