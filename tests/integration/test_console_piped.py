"""A real pool run as the reference recommends for CI (``python -u app.py > run.log 2>&1``):
the log console, the tasks' relayed output (a last print without a newline among it) and the
client's own prints each keep whole lines in the one file (issue 29, finding 10)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TASKS = 12

SCRIPT = textwrap.dedent(f"""
    import time

    import skyward_iac as sky

    @sky.function
    def chatty(n):
        for i in range(3):
            print(f"task {{n}} line {{i}}")
        print(f"task {{n}} no newline", end="")  # the task ends with its line open
        return n

    with sky.Compute(provider=sky.Local(), nodes=1,
                     options=sky.Options(console="log", gc_on_start=False)) as pool:
        futures = [chatty(n) > pool for n in range({TASKS})]
        i = 0
        while not all(future.done() for future in futures) or i < 200:
            print(f"client {{i}}", end="")
            print(" end")
            i += 1
            if i % 10 == 0:
                time.sleep(0.001)
        print("RESULT", sum(future.result() for future in futures))
""")
WHOLE = [re.compile(pattern) for pattern in (
    r"\d\d:\d\d:\d\d .+",                      # the console, warnings
    r"\[node 0\] task \d+ (line \d|no newline)",  # relayed task output
    r"client \d+ end",
    rf"RESULT {sum(range(TASKS))}",
)]


def test_a_piped_pool_keeps_every_writers_lines_whole(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    log = tmp_path / "run.log"
    with log.open("wb") as sink:
        done = subprocess.run([sys.executable, "-u", str(script)], check=False, cwd=tmp_path,
                              stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=240)
    lines = log.read_text().splitlines()
    assert done.returncode == 0, "\n".join(lines[-30:])
    spliced = [line for line in lines if not any(p.fullmatch(line) for p in WHOLE)]
    assert not spliced, "\n".join(spliced[:10])
    for n in range(TASKS):  # a task's unterminated last line is ended, not run into the next
        assert f"[node 0] task {n} no newline" in lines
    assert any(re.fullmatch(r"\d\d:\d\d:\d\d stack \S+ destroyed in .+", line) for line in lines)
