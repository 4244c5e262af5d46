"""Console lines, warnings and relayed remote output never land inside a line the user's code
prints, with stdout and stderr on one file (issue 29, finding 10).

``interleaving_child.py`` prints thousands of lines in pieces while three threads write ours
as fast as they can; run as the reference recommends (``python -u app.py > run.log 2>&1``),
every line of the file must be one whole line of one writer. Before ``observability/streams.py``
a few hundred lines per run were spliced (``user 68 printed20:46:39 pulumi up ...``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("interleaving_child.py")
ROOT = Path(__file__).resolve().parents[2]
LINES = 1500
CLOCK = r"\d\d:\d\d:\d\d "
#: Every line a run may print, whole.
WHOLE = [re.compile(pattern) for pattern in (
    r"user \d+ (printed in two pieces|written in two writes|to stderr in two pieces|whole) end",
    r"\[node \d\] remote \d+ (whole|no newline)",
    CLOCK + r"pulumi up \[\d+\] create node-\d+ \(LocalNode\)",
    CLOCK + r"(ERROR )?console \d+ (first|second)",
    CLOCK + r"WARNING skyward: warning \d+",
    r"DONE",
)]


def run(tmp_path: Path, mode: str, *python: str) -> list[str]:
    log = tmp_path / f"run-{mode}.log"
    with log.open("wb") as sink:  # one file for both streams: `> run.log 2>&1`
        done = subprocess.run([sys.executable, *python, str(CHILD), mode, str(LINES)],
                              check=False, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=120)
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    return text.splitlines()


def check(lines: list[str], mode: str) -> None:
    spliced = [line for line in lines if not any(p.fullmatch(line) for p in WHOLE)]
    assert not spliced, f"{len(spliced)} spliced line(s), such as:\n" + "\n".join(spliced[:10])
    users = [line for line in lines if line.startswith("user ")]
    assert len(users) == LINES and len(set(users)) == LINES
    assert lines[-1] == "DONE"
    # Our writers did write while the user printed (else nothing was tested).
    assert any(line.startswith("[node ") and line.endswith("no newline") for line in lines)
    assert any(re.match(CLOCK + "WARNING", line) for line in lines)
    if mode != "silent":
        assert any(re.match(CLOCK + "ERROR console", line) for line in lines)


# Each run splices hundreds of lines without the fix: one run per mode shows it, and the log
# console runs twice. "rich" falls back to log lines, as the output is not a terminal.
@pytest.mark.parametrize(("mode", "run_"), [("log", 1), ("log", 2), ("minimal", 1),
                                            ("silent", 1), ("rich", 1)])
def test_no_line_of_ours_lands_inside_a_users_line(tmp_path: Path, mode: str, run_: int) -> None:
    check(run(tmp_path, mode, "-u"), mode)


def test_without_u_the_users_buffered_lines_stay_whole_too(tmp_path: Path) -> None:
    check(run(tmp_path, "log"), "log")
