"""``skyward-iac ssh``, ``forward`` and ``cp`` against a live 2-node Local pool held by another
process (tests/chaos/child_pool.py), as a user would run them: real sshd per node, the stack's
key and pinned host keys read from the stack, nothing in ``~/.ssh``.

The last test takes the stack down (its owner frozen first, as in test_cli_commands.py) and
checks every command then refuses it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.infra.stacks import access
from tests.chaos.test_lifecycle_chaos import ROOT, Child, holding_pool
from tests.helpers import http_get_as_nobody
from tests.unit.test_cli_offers import run as cli  # skyward-iac in this process

pytestmark = pytest.mark.integration
HOME = Path.home()


@pytest.fixture(scope="module")
def owner() -> Iterator[Child]:
    """A child process holding a 2-node Local pool open."""
    with holding_pool(nodes=2, ttl=180) as child:
        yield child


def skyward_iac(*args: str, cwd: Path = ROOT, stdin: str | None = None,
                ) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: its own process."""
    return subprocess.run([sys.executable, "-m", "skyward_iac.cli", *args], cwd=cwd,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=240)


def test_ssh_runs_a_command_on_node_1_and_returns_its_status(owner: Child) -> None:
    known_hosts = HOME / ".ssh" / "known_hosts"
    before = known_hosts.read_bytes() if known_hosts.exists() else None
    done = skyward_iac("ssh", owner.stack or "?", "--node", "1", "--", "hostname")
    assert done.returncode == 0, done.stderr
    assert done.stdout == socket.gethostname() + "\n"  # a Local node is this machine
    assert (known_hosts.read_bytes() if known_hosts.exists() else None) == before
    # On node 1 (its own sandbox), in its workdir, its venv first; stderr apart; the status.
    done = skyward_iac("ssh", owner.stack or "?", "--node", "1", "--", "sh", "-c",
                       "echo $SKYWARD_LOCAL_SANDBOX; pwd; command -v python; "
                       "echo oops >&2; exit 7")
    assert done.returncode == 7
    sandbox, cwd, python = done.stdout.splitlines()
    assert sandbox.endswith(f"{owner.stack}/node-1") and cwd == f"{sandbox}/work"
    assert python == f"{sandbox}/work/venv/bin/python"
    assert done.stderr == "oops\n"
    # sshd's SetEnv SHLVL=1 makes the login shell a second-level one, so bash run by sshd
    # skips the user's ~/.bashrc: nothing in it can slow or break a node's commands. (A
    # one-command `bash -c` execs it at the level it was given: 1 here, 0 without SetEnv.)
    level = skyward_iac("ssh", owner.stack or "?", "--node", "1", "--", "printenv", "SHLVL")
    assert level.returncode == 0 and int(level.stdout) >= 1, level.stdout + level.stderr


def test_ssh_forwards_stdin_to_a_shell_without_a_terminal(owner: Child) -> None:
    done = skyward_iac("ssh", owner.stack or "?", stdin="echo from stdin $((6 * 7))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from stdin 42\n"


def test_ssh_all_prints_every_node_under_its_index_in_order(
        owner: Child, capsys: pytest.CaptureFixture[str]) -> None:
    stack = owner.stack or "?"
    # Node 1 is made slower, so node order is not the order the outputs came in.
    script = ('i=${SKYWARD_LOCAL_SANDBOX##*-}; [ "$i" = 1 ] && sleep 1; echo "I am $i"; '
              'echo "err $i" >&2; exit "$i"')
    code, out, err = cli(capsys, "ssh", stack, "--all", "-n", "--", script)
    assert code == 1  # node 1's status: the first node that failed
    assert out == "=== node 0: exit 0 ===\nI am 0\n=== node 1: exit 1 ===\nI am 1\n"
    assert err == "=== node 0 (stderr) ===\nerr 0\n=== node 1 (stderr) ===\nerr 1\n"
    code, out, err = cli(capsys, "ssh", stack, "--all", "--json", "--", "echo ok")
    assert code == 0, err
    assert [(r["node"], r["exit_status"], r["stdout"]) for r in json.loads(out)] == [
        (0, 0, "ok\n"), (1, 0, "ok\n")]


def test_ssh_refuses_an_unknown_node_and_misused_options_in_one_line(
        owner: Child, capsys: pytest.CaptureFixture[str]) -> None:
    stack = owner.stack or "?"
    for argv, code in ((("--node", "2", "--", "hostname"), 2), (("--all",), 2),
                       (("--all", "--node", "1", "--", "x"), 2)):
        got, out, err = cli(capsys, "ssh", stack, *argv)
        assert got == code and out == "" and len(err.splitlines()) == 1, (argv, err)
    _, _, err = cli(capsys, "ssh", stack, "--node", "2", "--", "hostname")
    assert err == f"skyward-iac: {stack} has no node 2; it has nodes 0, 1\n"
    code, _, err = cli(capsys, "ssh", "local-nobody-20000101-000000-000000", "--", "x")
    assert code == 3 and "no stack named" in err


def test_an_interactive_shell_gets_a_pty_of_the_terminals_size(owner: Child) -> None:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    shell = subprocess.Popen([sys.executable, "-m", "skyward_iac.cli", "ssh", owner.stack or "?",
                              "--node", "1"], cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
                             start_new_session=True)
    os.close(slave)
    seen = bytearray()

    def read_until(marker: bytes, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while marker not in seen:
            if time.monotonic() > deadline:
                raise AssertionError(f"never saw {marker!r} in {bytes(seen)!r}")
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen.extend(os.read(master, 4096))
                except OSError:  # the shell ended
                    raise AssertionError(f"ended before {marker!r}: {bytes(seen)!r}") from None

    try:
        # The prompt (it names node-1/work, but a long path wraps at the terminal's width):
        # type only once the shell reads.
        read_until(b"# " if os.getuid() == 0 else b"$ ")
        os.write(master, b"stty size; tty; echo $((6*7))X\n")
        read_until(b"42X\r\n")
        assert b"33 111\r\n" in seen and b"/dev/pts/" in seen
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        shell.send_signal(signal.SIGWINCH)  # what the terminal sends when it is resized
        time.sleep(0.5)
        os.write(master, b"stty size; exit 3\n")
        assert shell.wait(60) == 3
        with_end = bytes(seen)
        while select.select([master], [], [], 0.2)[0]:
            try:
                with_end += os.read(master, 4096)
            except OSError:
                break
        assert b"40 120\r\n" in with_end
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()
        os.close(master)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_forward_reaches_a_server_on_node_0_and_serves_its_user_only(
        owner: Child, tmp_path: Path) -> None:
    stack, port = owner.stack or "?", free_port()
    (tmp_path / "index.html").write_text("hello from node 0")
    # A server started from a shell on the node, in the background, as a user would.
    started = skyward_iac("ssh", stack, "-n", "--",
                          f"python -m http.server {port} --bind 127.0.0.1 "
                          f"--directory {tmp_path} > /dev/null 2>&1 & echo $!")
    assert started.returncode == 0, started.stderr
    server_pid = int(started.stdout)
    forward = subprocess.Popen([sys.executable, "-m", "skyward_iac.cli", "forward", stack,
                                str(port)], cwd=ROOT, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        found = re.match(rf"forwarding 127\.0\.0\.1:(\d+) to port {port} on node 0", line)
        assert found, line
        local = int(found.group(1))
        body = fetch(f"http://127.0.0.1:{local}/index.html")
        assert body == "hello from node 0"
        assert http_get_as_nobody(local) in ("b''", "reset")  # closed, nothing served
        assert fetch(f"http://127.0.0.1:{local}/index.html") == "hello from node 0"
    finally:
        forward.send_signal(signal.SIGTERM)
        _, err = forward.communicate(timeout=120)
        skyward_iac("ssh", stack, "-n", "--", f"kill {server_pid}")
    assert forward.returncode == 0, err
    assert "closed a connection from another user" in err
    with pytest.raises(OSError):  # the forward is closed
        socket.create_connection(("127.0.0.1", local), timeout=5).close()


def fetch(url: str, timeout: float = 60) -> str:
    """The body at ``url``, retried while the server is still starting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return str(response.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_cp_copies_directories_both_ways(owner: Child, tmp_path: Path) -> None:
    stack = owner.stack or "?"
    source = tmp_path / "run"
    (source / "ckpt").mkdir(parents=True)
    (source / "ckpt" / "model.bin").write_bytes(os.urandom(3 << 20))
    (source / "notes.txt").write_text("epoch 3\n")
    (source / "notes.txt").chmod(0o640)
    # Relative local paths are the caller's (cwd); a relative node path is in its workdir.
    up = skyward_iac("cp", "run", f"{stack}:1:uploaded", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert up.stdout == f"copied 2 file(s), {(3 << 20) + 8} bytes\n"
    listed = skyward_iac("ssh", stack, "--node", "1", "-n", "--",
                         "stat -c '%a %s %n' uploaded/notes.txt uploaded/ckpt/model.bin")
    assert listed.stdout.splitlines() == ["640 8 uploaded/notes.txt",
                                          f"644 {3 << 20} uploaded/ckpt/model.bin"]
    (tmp_path / "back").mkdir()
    down = skyward_iac("cp", f"{stack}:1:uploaded", "back", cwd=tmp_path)  # into a directory
    assert down.returncode == 0, down.stderr
    copy = tmp_path / "back" / "uploaded"
    assert (copy / "ckpt" / "model.bin").read_bytes() == (source / "ckpt" / "model.bin").read_bytes()
    assert (copy / "notes.txt").read_text() == "epoch 3\n"
    assert (copy / "notes.txt").stat().st_mode & 0o777 == 0o640
    one = skyward_iac("cp", f"{stack}:1:uploaded/notes.txt", "n.txt", cwd=tmp_path)
    assert one.returncode == 0 and (tmp_path / "n.txt").read_text() == "epoch 3\n"
    missing = skyward_iac("cp", f"{stack}:0:/no/such/file", "x", cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr == "skyward-iac: node 0:/no/such/file: No such file\n"


def test_every_action_is_in_the_access_log_then_a_down_stack_is_refused(
        owner: Child, capsys: pytest.CaptureFixture[str]) -> None:
    stack = owner.stack or "?"
    code, out, err = cli(capsys, "show", stack, "--json")
    assert code == 0, err
    report = json.loads(out)
    actions = [entry["action"] for entry in report["access"]]
    assert "ssh node 1: command hostname" in actions
    assert "ssh every node: command [" in actions  # `i=...` skipped: it may hold a secret
    assert "ssh every node: command echo" in actions
    assert "ssh node 1: shell" in actions
    assert any(re.fullmatch(r"forward node 0 port \d+ to 127\.0\.0\.1:\d+", a) for a in actions)
    assert any(a.startswith("cp to node 1:/") and a.endswith("/work/uploaded") for a in actions)
    assert any(a.startswith("cp from node 1:/") for a in actions)
    assert {entry["by"] for entry in report["access"]} == {access.actor()}
    assert not any(key.startswith("access.") for key in report["tags"])
    code, out, _ = cli(capsys, "history", "--json")
    [run] = [r for r in json.loads(out) if r["stack"] == stack]
    assert len(run["access"]) == len(report["access"])

    owner.signal(signal.SIGSTOP)  # alive but unable to bring back the nodes we destroy
    try:
        code, _, err = cli(capsys, "down", stack, "--force")
        assert code == 0, err
    finally:
        os.kill(owner.process.pid, signal.SIGCONT)
    for argv in (("ssh", stack, "--", "hostname"), ("forward", stack, "8888"),
                 ("cp", f"{stack}:0:/x", "x")):
        code, out, err = cli(capsys, *argv)
        assert code == 3 and out == "", (argv, err)
        assert err == (f"skyward-iac: {stack} is down: it has no nodes to reach (its history "
                       f"stays: skyward-iac show {stack})\n")
