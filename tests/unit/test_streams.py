"""``observability/streams.py``: our lines wait for the user's line to end, in the same file."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

from skyward_iac.api.runtime import RoutedStream, redirect_output, route_output
from skyward_iac.observability import streams
from skyward_iac.observability.streams import TrackedStream, track_streams, write_lines


@pytest.fixture()
def log(tmp_path: Path) -> Iterator[tuple[Path, TextIO, TextIO]]:
    """One file opened twice, as stdout and stderr redirected to it are: (path, out, err)."""
    path = tmp_path / "run.log"
    with path.open("a") as out, path.open("a") as err:
        yield path, out, err


def test_a_line_of_ours_waits_for_the_users_line_to_end(log: tuple[Path, TextIO, TextIO]) -> None:
    path, out, err = log
    user, ours = TrackedStream(out), TrackedStream(err)
    user.write("completed: slow")
    user.flush()
    write_lines(ours, "19:41:46 tasks: 1 done")
    assert path.read_text() == "completed: slow"  # held back
    user.write("\n")
    assert path.read_text() == "completed: slow\n19:41:46 tasks: 1 done\n"


def test_the_users_buffered_lines_go_first(log: tuple[Path, TextIO, TextIO]) -> None:
    path, out, err = log
    user = TrackedStream(out)  # block-buffered, as stdout to a file without -u
    user.write("first\n")
    user.write("second\n")
    assert path.read_text() == ""
    write_lines(err, "ours")  # the other stream, untracked itself: found by its file
    assert path.read_text() == "first\nsecond\nours\n"


def test_a_line_left_open_is_ended_after_the_grace(log: tuple[Path, TextIO, TextIO],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "GRACE", 0.2)
    path, out, err = log
    user = TrackedStream(out)
    user.write("progress 10%")
    write_lines(err, "ours")
    deadline = time.monotonic() + 10
    while path.read_text() != "progress 10%\nours\n":
        assert time.monotonic() < deadline, path.read_text()
        time.sleep(0.05)
    user.write(" 20%\n")
    user.flush()
    assert path.read_text() == "progress 10%\nours\n 20%\n"


def test_other_files_do_not_wait(tmp_path: Path) -> None:
    with (tmp_path / "out").open("a") as out, (tmp_path / "err").open("a") as err:
        user = TrackedStream(out)
        user.write("open line")
        write_lines(err, "ours")
        assert (tmp_path / "err").read_text() == "ours\n"


def test_output_routed_away_from_the_file_leaves_no_line_open(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Output control's RoutedStream stays in front; the tracking goes beneath it."""
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    route_output()
    track_streams()
    assert isinstance(sys.stdout, RoutedStream) and isinstance(sys.stdout.inner, TrackedStream)
    caught: list[str] = []
    with redirect_output(caught.append):
        print("captured", end="")  # goes to the callback, not the file
    write_lines(sys.stdout, "ours")
    assert sys.stdout.inner.inner.getvalue() == "ours\n" and caught == ["captured"]
    track_streams()  # idempotent
    assert isinstance(sys.stdout.inner.inner, io.StringIO)


def test_lines_waiting_at_exit_are_written(tmp_path: Path) -> None:
    program = ("import sys\n"
               "from skyward_iac.observability.streams import track_streams, write_lines\n"
               "track_streams()\n"
               "print('no end', end='')\n"
               "write_lines(sys.stderr, 'the last console line')\n")
    path = tmp_path / "run.log"
    with path.open("wb") as sink:
        subprocess.run([sys.executable, "-u", "-c", program], stdout=sink,
                       stderr=subprocess.STDOUT, check=True, timeout=60)
    assert path.read_text() == "no end\nthe last console line\n"
