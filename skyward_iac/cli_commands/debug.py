"""``skyward-iac ssh``, ``forward`` and ``cp``: a shell, commands, ports and files on the nodes
of a live pool, reached the way the pool reaches them (``node_access.py``), each action
recorded in the stack's access log while it runs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import posixpath
import re
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyward_iac.cli_commands.live import ERROR, OK, USAGE
from skyward_iac.cli_commands.node_access import (
    LiveTarget,
    NodeLink,
    Recording,
    Refused,
    TroubleLines,
    connect,
    live_target,
)
from skyward_iac.cli_commands.paths import path_arg
from skyward_iac.outputs import NodeAddress

#: The exit status of a command or shell interrupted by Ctrl+C here (128 + SIGINT).
INTERRUPTED = 130
#: ``STACK:NODE:PATH`` in ``cp``: a stack name has no ``:`` or ``/``; write ``./a:1:b`` for a
#: local file of that name.
NODE_PATH = re.compile(r"^(?P<stack>[A-Za-z0-9][A-Za-z0-9_.-]*):(?P<node>\d+):(?P<path>.*)$")


def add_commands(commands: Any) -> None:
    """Register ``ssh``, ``forward`` and ``cp`` on the CLI's sub-command parser."""
    ssh = commands.add_parser(
        "ssh", help="a shell or a command on a live pool's node",
        description="Open a shell on a node of a live stack (a PTY, when this is a terminal), "
                    "or run COMMAND there and exit with its status; with the stack's own key "
                    "and pinned host keys. One word after -- is a shell command line; several "
                    "are a program and its arguments. It starts in the node's workdir with the "
                    "node's venv first on PATH.")
    ssh.add_argument("stack", help="stack name, as `skyward-iac ls` prints it")
    options = argparse.ArgumentParser(prog="skyward-iac ssh STACK", add_help=False)
    for parser in (ssh, options):
        _ssh_options(parser)
    ssh.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                     help="what to run (default: a login shell)")
    ssh.set_defaults(run=run_ssh, options=options)

    forward = commands.add_parser(
        "forward", help="forward a local port to a port on a live pool's node",
        description="Listen on 127.0.0.1 and forward every connection of yours (other users' "
                    "are closed) to REMOTE_PORT on the node's loopback, until Ctrl+C.")
    forward.add_argument("stack", help="stack name, as `skyward-iac ls` prints it")
    forward.add_argument("remote_port", type=int, metavar="REMOTE_PORT")
    forward.add_argument("--node", type=int, default=0, metavar="N", help="the node (default 0)")
    forward.add_argument("--local", type=int, default=0, metavar="PORT",
                         help="the local port (default: a free one, printed)")
    forward.set_defaults(run=run_forward)

    cp = commands.add_parser(
        "cp", help="copy files or directories to or from a live pool's node",
        description="Copy over SFTP between this machine and a node: STACK:NODE:PATH names a "
                    "node's file or directory (a relative PATH is in the node's workdir). "
                    "Directories are copied with their contents; an existing directory as "
                    "destination receives the source under its own name.")
    cp.add_argument("source", metavar="SOURCE")
    cp.add_argument("destination", metavar="DESTINATION")
    cp.set_defaults(run=run_cp)


def _ssh_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", type=int, metavar="N", help="the node (default 0)")
    parser.add_argument("--all", action="store_true",
                        help="run COMMAND on every node, each node's output under its index")
    parser.add_argument("-t", "--tty", action="store_true",
                        help="run COMMAND in a PTY (for top, htop, watch ...)")
    parser.add_argument("-n", "--no-stdin", action="store_true",
                        help="give COMMAND no input (stdin is forwarded otherwise)")
    parser.add_argument("--json", action="store_true", help="with --all: machine-readable output")


def split_words(words: list[str]) -> tuple[list[str], list[str]]:
    """(options, command) among the words after the stack name: options up to ``--`` and the
    command after it; without ``--`` the words are the command, unless they start with an
    option (``ssh STACK --node 1``)."""
    if "--" in words:
        cut = words.index("--")
        return words[:cut], words[cut + 1:]
    if words and words[0].startswith("-"):
        return words, []
    return [], words


def run_ssh(args: argparse.Namespace) -> int:
    from skyward_iac.remote import shell

    options, words = split_words(args.command)
    args.options.parse_args(options, namespace=args)
    try:
        if args.all and (not words or args.node is not None or args.tty):
            raise Refused(USAGE, "--all runs one command on every node: "
                                 "skyward-iac ssh STACK --all -- COMMAND (without --node or -t)")
        line = shell.command_line(words) if words else ""
        pty = args.tty or (not words and os.isatty(0) and os.isatty(1))
        if pty and not os.isatty(0):
            raise Refused(USAGE, "-t needs a terminal on stdin")
        target = live_target(args.stack, None if args.all else args.node or 0)
    except Refused as refused:
        return refused.report()
    what = f"command {program(line)}" if line else "shell"
    where = "every node" if args.all else f"node {target.nodes[0].index}"
    recording = Recording(target.stack, f"ssh {where}: {what}")
    try:
        if args.all:
            return run_everywhere(target, line, args.json)
        node = target.nodes[0]
        remote = shell.node_command(node.workdir, line or shell.LOGIN_SHELL)
        with connect(node, target.outputs) as connection:
            if pty:
                return shell.interactive(connection.transport, remote, 0, 1,
                                         os.environ.get("TERM", "xterm-256color"))
            sys.stdout.flush()
            return shell.run(connection.transport, remote, sys.stdout.buffer, sys.stderr.buffer,
                             None if args.no_stdin else 0)
    except KeyboardInterrupt:
        return INTERRUPTED
    finally:
        recording.finish()


def program(line: str) -> str:
    """The name of the program a command line starts with (what the access log records of
    it: its arguments may hold a secret)."""
    for word in re.findall(r"[^\s;|&()<>]+", line):
        if not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", word):  # VAR=value: maybe a secret
            return posixpath.basename(word.strip("'\"")) or "?"
    return "?"


@dataclass(frozen=True, slots=True)
class NodeResult:
    """One node's part of ``ssh --all``: its exit status (None: it could not be reached)."""

    node: int
    status: int | None
    stdout: bytes
    stderr: bytes
    error: str = ""


def everywhere_status(results: list[NodeResult]) -> int:
    """``ssh --all``'s exit status: 0 when every node's command exited 0, else the status of
    the first node (by index) whose did not, 1 for a node that could not be reached."""
    for result in results:
        if result.status != 0:
            return ERROR if result.status is None else result.status
    return OK


def run_everywhere(target: LiveTarget, line: str, as_json: bool) -> int:
    """Run ``line`` on every node at once; print each node's output in node order."""
    with ThreadPoolExecutor(max_workers=min(32, len(target.nodes))) as threads:
        results = list(threads.map(lambda node: _capture(target, node, line), target.nodes))
    if as_json:
        print(json.dumps([{"node": r.node, "exit_status": r.status, "error": r.error or None,
                           "stdout": r.stdout.decode(errors="replace"),
                           "stderr": r.stderr.decode(errors="replace")} for r in results],
                         indent=2))
        return everywhere_status(results)
    for result in results:
        said = f"exit {result.status}" if result.status is not None else f"failed: {result.error}"
        _section(sys.stdout, f"=== node {result.node}: {said} ===", result.stdout)
        if result.stderr:
            _section(sys.stderr, f"=== node {result.node} (stderr) ===", result.stderr)
    return everywhere_status(results)


def _capture(target: LiveTarget, node: NodeAddress, line: str) -> NodeResult:
    from skyward_iac.api.errors import SkywardError
    from skyward_iac.remote import shell

    out, err = io.BytesIO(), io.BytesIO()
    try:
        with connect(node, target.outputs) as connection:
            status = shell.run(connection.transport, shell.node_command(node.workdir, line),
                               out, err)
    except (SkywardError, OSError, EOFError) as exc:
        return NodeResult(node.index, None, out.getvalue(), err.getvalue(), str(exc))
    return NodeResult(node.index, status, out.getvalue(), err.getvalue())


def _section(stream: Any, header: str, body: bytes) -> None:
    text = body.decode(errors="replace")
    stream.write(f"{header}\n{text}{'' if not text or text.endswith(chr(10)) else chr(10)}")
    stream.flush()


def run_forward(args: argparse.Namespace) -> int:
    from skyward_iac.remote.forward import LocalForward

    try:
        if not 1 <= args.remote_port <= 65535 or not 0 <= args.local <= 65535:
            raise Refused(USAGE, f"ports are 1..65535 (REMOTE_PORT {args.remote_port}, "
                                 f"--local {args.local}; 0 picks a free one)")
        target = live_target(args.stack, args.node)
    except Refused as refused:
        return refused.report()
    node = target.nodes[0]
    link = NodeLink(node, target.outputs)
    try:
        forward = LocalForward(link.transport, ("127.0.0.1", args.remote_port),
                               TroubleLines(node.index, args.remote_port),
                               local_port=args.local)
    except OSError as exc:
        link.close()
        return Refused(ERROR, f"cannot listen on 127.0.0.1:{args.local}: "
                              f"{exc.strerror or exc}").report()
    recording = Recording(target.stack, f"forward node {node.index} port {args.remote_port} "
                                        f"to 127.0.0.1:{forward.port}")
    print(f"forwarding 127.0.0.1:{forward.port} to port {args.remote_port} on node "
          f"{node.index} of {args.stack}; Ctrl+C stops", flush=True)
    stop_on_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        return OK
    finally:
        signal.signal(signal.SIGTERM, stop_on_term)
        forward.close()
        link.close()
        recording.finish()


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def run_cp(args: argparse.Namespace) -> int:
    from skyward_iac.remote import sftp_copy

    source, destination = location(args.source), location(args.destination)
    try:
        if isinstance(source, NodePath) == isinstance(destination, NodePath):
            raise Refused(USAGE, "cp copies between this machine and a node: one of SOURCE "
                                 "and DESTINATION is STACK:NODE:PATH, the other a local path")
        far = source if isinstance(source, NodePath) else destination
        assert isinstance(far, NodePath)
        target = live_target(far.stack, far.node)
    except Refused as refused:
        return refused.report()
    node = target.nodes[0]
    path = sftp_copy.remote_path(node.workdir, far.path)
    down = isinstance(source, NodePath)
    recording = Recording(target.stack, f"cp {'from' if down else 'to'} node {node.index}:{path}")
    try:
        with connect(node, target.outputs) as connection:
            sftp = connection.sftp()
            if down:
                assert isinstance(destination, Path)
                copied = sftp_copy.download(sftp, path, destination)
            else:
                assert isinstance(source, Path)
                copied = sftp_copy.upload(sftp, source, path)
    except OSError as exc:  # the source is missing, a destination cannot be written...
        name = exc.filename or (f"node {node.index}:{path}" if down else str(source))
        return Refused(ERROR, f"{name}: {exc.strerror or exc}").report()
    finally:
        recording.finish()
    links = f", {copied.links} link(s)" if copied.links else ""
    print(f"copied {copied.files} file(s), {copied.bytes} bytes{links}")
    return OK


@dataclass(frozen=True, slots=True)
class NodePath:
    """``STACK:NODE:PATH`` of ``cp``."""

    stack: str
    node: int
    path: str


def location(text: str) -> NodePath | Path:
    """A ``cp`` argument: a node's path, or a local one made absolute against the working
    directory."""
    if found := NODE_PATH.match(text):
        return NodePath(found["stack"], int(found["node"]), found["path"])
    return path_arg(text)
