"""A shell or a command on a node over its SSH connection, as ``ssh`` runs them.

``interactive`` gives the local terminal to a remote PTY: raw mode (every key, Ctrl+C
included, goes to the node), the window size passed at start and again on every ``SIGWINCH``.
``run`` runs a command without a PTY: its stdout and stderr arrive apart, byte for byte, and
the local stdin is forwarded until it ends. Both return the remote exit status.

Both start in the node's workdir with its venv first on ``PATH`` (``node_command``), where
the pool's own Python, its packages and the logs are.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import shlex
import signal
import struct
import termios
import threading
import tty
from typing import IO, Any

import paramiko

#: Bytes read from a channel or from stdin at a time.
_CHUNK = 32 << 10
#: The exit status when the node sent none (the command was killed by a signal), as ssh says.
NO_STATUS = 255
#: The shell an interactive session starts (the user's login shell, as sshd names it).
LOGIN_SHELL = 'exec "${SHELL:-/bin/sh}" -l'


def node_command(workdir: str, command: str) -> str:
    """``command`` as the node's shell runs it: in ``workdir``, with the node's venv first on
    ``PATH``. A missing workdir fails the command (exit 1) instead of running it elsewhere.
    The command is a line of its own, so that ``server &`` puts only the server in the
    background, as ``ssh`` does (not a subshell holding the session open)."""
    venv = f"{workdir}/venv"
    return (f"cd {shlex.quote(workdir)} || exit 1\n"
            f"export PATH={shlex.quote(venv + '/bin')}:\"$PATH\" VIRTUAL_ENV={shlex.quote(venv)}\n"
            f"{command}")


def command_line(words: list[str]) -> str:
    """What the node's shell runs for the words after ``--``: one word is a shell command line
    as typed (``'ps aux | grep agent'``); several are a program and its arguments, each quoted
    (``sh -c 'echo $HOME'`` stays three words)."""
    return words[0] if len(words) == 1 else shlex.join(words)


def exit_status(channel: paramiko.Channel) -> int:
    """The remote command's exit status, ``NO_STATUS`` when it sent none."""
    status = channel.recv_exit_status()
    return NO_STATUS if status < 0 else status


def run(transport: paramiko.Transport, command: str, out: IO[bytes], err: IO[bytes],
        stdin: int | None = None, timeout: float = 20.0) -> int:
    """Run ``command`` (no PTY) and return its exit status; its stdout goes to ``out``, its
    stderr to ``err``, and what can be read from the file descriptor ``stdin`` to the command
    until it ends (None: the command's stdin is closed at once)."""
    channel = transport.open_session(timeout=timeout)
    stop = threading.Event()
    try:
        channel.exec_command(command)
        readers = [threading.Thread(target=_drain, args=(channel.recv, out), daemon=True),
                   threading.Thread(target=_drain, args=(channel.recv_stderr, err), daemon=True)]
        for reader in readers:
            reader.start()
        if stdin is None:
            channel.shutdown_write()
        else:
            threading.Thread(target=_pump, args=(stdin, channel, stop), daemon=True).start()
        for reader in readers:
            while reader.is_alive():
                reader.join(0.2)  # a short join keeps Ctrl+C responsive
        return exit_status(channel)
    finally:
        stop.set()
        channel.close()


def interactive(transport: paramiko.Transport, command: str, stdin: int, stdout: int,
                term: str, timeout: float = 20.0) -> int:
    """Run ``command`` in a remote PTY wired to the local terminal ``stdin``/``stdout`` (file
    descriptors; ``stdin`` must be a terminal) and return its exit status. The terminal is in
    raw mode meanwhile and restored after, whatever happens."""
    channel = transport.open_session(timeout=timeout)
    try:
        columns, rows = window_size(stdout)
        channel.get_pty(term=term, width=columns, height=rows)
        channel.exec_command(command)
        saved = termios.tcgetattr(stdin)
        previous = signal.signal(signal.SIGWINCH,
                                 lambda *_: channel.resize_pty(*window_size(stdout)))
        try:
            tty.setraw(stdin)
            _relay(channel, stdin, stdout)
        finally:
            signal.signal(signal.SIGWINCH, previous)
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        return exit_status(channel)
    finally:
        channel.close()


def window_size(fd: int) -> tuple[int, int]:
    """The terminal's (columns, rows); 80x24 when ``fd`` is not a terminal."""
    with contextlib.suppress(OSError):
        size = fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
        rows, columns, _, _ = struct.unpack("HHHH", size)
        if rows and columns:
            return columns, rows
    return 80, 24


def _relay(channel: paramiko.Channel, stdin: int, stdout: int) -> None:
    """Copy keys to the channel and its output to the terminal until the remote side ends."""
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ, "node")
    selector.register(stdin, selectors.EVENT_READ, "keys")
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "node":
                    data = channel.recv(_CHUNK)
                    if not data:
                        return
                    _write_all(stdout, data)
                else:
                    keys = os.read(stdin, _CHUNK)
                    if keys:
                        channel.sendall(keys)
                    else:  # the terminal is gone: the remote side gets EOF
                        selector.unregister(stdin)
                        channel.shutdown_write()
    finally:
        selector.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _drain(recv: Any, sink: IO[bytes]) -> None:
    """Copy one of the channel's streams to ``sink`` until it ends."""
    while data := recv(_CHUNK):
        sink.write(data)
        sink.flush()


def _pump(fd: int, channel: paramiko.Channel, stop: threading.Event) -> None:
    """Send what ``fd`` yields to the channel until it ends (then EOF) or ``stop`` is set.
    A select-based selector, because stdin may be a regular file, which epoll refuses."""
    selector = selectors.SelectSelector()
    selector.register(fd, selectors.EVENT_READ)
    try:
        while not stop.is_set():
            if not selector.select(0.2):
                continue
            data = os.read(fd, _CHUNK)
            if not data:
                channel.shutdown_write()
                return
            channel.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the command ended (its channel closed) while input was still coming
    finally:
        selector.close()
