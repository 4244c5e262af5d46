"""The parts of ``skyward-iac ssh/forward/cp`` that need no pool: words, paths, exit statuses,
the access log's entries, and who owns a socket accepted on loopback (a real ``nobody``)."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from skyward_iac.cli_commands.debug import (
    NodePath,
    NodeResult,
    everywhere_status,
    location,
    program,
    split_words,
)
from skyward_iac.cli_commands.node_access import Refused, pick_nodes
from skyward_iac.infra.stacks import access
from skyward_iac.infra.stacks.tags import MAX_TAG_VALUE, decode_tags, encode_tags
from skyward_iac.outputs import NodeAddress
from skyward_iac.remote.sftp_copy import remote_path
from skyward_iac.remote.shell import command_line, node_command
from skyward_iac.same_user import accepted_socket_owner, from_this_user


@pytest.mark.parametrize(("words", "expected"), [
    (["--", "hostname"], ([], ["hostname"])),
    (["--node", "1", "--", "ls", "--node"], (["--node", "1"], ["ls", "--node"])),
    (["--node", "1"], (["--node", "1"], [])),
    (["hostname", "-f"], ([], ["hostname", "-f"])),
    ([], ([], [])),
])
def test_ssh_options_end_at_the_double_dash(words: list[str],
                                            expected: tuple[list[str], list[str]]) -> None:
    assert split_words(words) == expected


def test_one_word_is_a_command_line_several_are_an_argv() -> None:
    assert command_line(["ps aux | grep agent"]) == "ps aux | grep agent"
    assert command_line(["sh", "-c", "echo $HOME"]) == "sh -c 'echo $HOME'"
    line = node_command("/w d", "server &")
    # The command is a line of its own: `&` backgrounds the server, not the whole session.
    assert line.splitlines() == ["cd '/w d' || exit 1",
                                 "export PATH='/w d/venv/bin':\"$PATH\" VIRTUAL_ENV='/w d/venv'",
                                 "server &"]


@pytest.mark.parametrize(("line", "name"), [
    ("nvidia-smi -l 1", "nvidia-smi"),
    ("/usr/bin/py-spy dump --pid 7", "py-spy"),
    ("pwd; ls", "pwd"),
    ("TOKEN=s3cret curl -H x", "curl"),  # an assignment may hold a secret: never recorded
    ("A=1", "?"),
])
def test_the_access_log_names_the_program_only(line: str, name: str) -> None:
    assert program(line) == name


def node(index: int) -> NodeAddress:
    return NodeAddress(index, "10.0.0.1", "1.2.3.4", 22, "ubuntu", "ssh-ed25519 AAAA", "/w")


def test_nodes_are_picked_by_index_and_an_unknown_one_is_a_usage_error() -> None:
    nodes = (node(1), node(0))
    assert [n.index for n in pick_nodes("s", nodes, None)] == [0, 1]
    assert [n.index for n in pick_nodes("s", nodes, 1)] == [1]
    with pytest.raises(Refused) as refused:
        pick_nodes("s", nodes, 5)
    assert refused.value.code == 2 and str(refused.value) == "s has no node 5; it has nodes 0, 1"


def test_all_fails_with_the_first_failing_node() -> None:
    def result(index: int, status: int | None) -> NodeResult:
        return NodeResult(index, status, b"", b"")

    assert everywhere_status([result(0, 0), result(1, 0)]) == 0
    assert everywhere_status([result(0, 0), result(1, 7), result(2, 3)]) == 7
    assert everywhere_status([result(0, None), result(1, 7)]) == 1  # unreachable


def test_cp_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert location("local-ana-1:2:/ckpt/x.pt") == NodePath("local-ana-1", 2, "/ckpt/x.pt")
    assert location("s:0:") == NodePath("s", 0, "")
    assert location("out/x.pt") == tmp_path / "out" / "x.pt"  # the caller's cwd
    assert location("./a:1:b") == tmp_path / "a:1:b"
    assert remote_path("/w", "log/agent.log") == "/w/log/agent.log"
    assert remote_path("/w", "") == "/w" and remote_path("/w", "/etc/x") == "/etc/x"


def test_access_entries_are_tags_of_their_own_read_back_newest_first() -> None:
    first = access.entry_tag("ssh node 1: shell", "ana@box",
                             datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC))
    second = access.entry_tag("cp from node 0:/w/x", "bo@laptop",
                              datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=UTC))
    assert len("skyward:" + first[0]) <= 40  # Pulumi's longest tag name
    assert len(access.entry_tag("x" * 400, "a@b", datetime.now(UTC))[1]) == MAX_TAG_VALUE
    tags = {"owner": "ana@box", "nodes": "2", **dict([first, second])}
    # Stored as separate tags, not inside the run tag (whose rewrite would drop them).
    stored = encode_tags(tags)
    assert stored[first[0]] == first[1] and first[0] not in stored["run"]
    assert decode_tags(stored) == tags
    assert access.listing(tags) == [
        {"at": "2026-01-02T03:04:05+00:00", "by": "bo@laptop", "action": "cp from node 0:/w/x"},
        {"at": "2026-01-02T03:04:05+00:00", "by": "ana@box", "action": "ssh node 1: shell"},
    ]


CONNECT = """
import socket, sys, time
client = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print(client.getsockname()[1], flush=True)
time.sleep(30)
"""


def test_the_owner_of_an_accepted_socket_is_its_clients_user() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    mine = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    other = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
         "-c", CONNECT, str(port)], stdout=subprocess.PIPE, text=True, cwd="/",
        env={**os.environ, "PYTHONPATH": ""})
    try:
        assert accepted_socket_owner(accepted) == os.getuid() and from_this_user(accepted)
        assert other.stdout is not None
        other_port = int(other.stdout.readline())
        theirs, (_, peer_port) = server.accept()
        assert peer_port == other_port
        assert accepted_socket_owner(theirs) == pwd.getpwnam("nobody").pw_uid
        assert not from_this_user(theirs)
        theirs.close()
        assert accepted_socket_owner(theirs) is None  # a closed socket is nobody's
    finally:
        other.kill()
        other.wait()
        for sock in (accepted, mine, server):
            sock.close()
