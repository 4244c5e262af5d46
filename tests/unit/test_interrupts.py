"""``orchestration/interrupts.py``: a Ctrl+C that ends a script ends its process by SIGINT, even
when it lands in an exit hook or another thread runs ``exec`` while the interpreter shuts down
(issue 29, finding 7). Each case runs a real interpreter; the pool cases are in
``tests/chaos/test_lifecycle_chaos.py``."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROLOGUE = textwrap.dedent("""
    import atexit, sys, threading, time
    from skyward_iac.orchestration import interrupts
    if sys.argv[1] == "installed":
        interrupts.install()
    unclosed = open(sys.argv[2], "w")  # flushed only if the interpreter finalizes
    unclosed.write("flushed at exit\\n")
""")

#: The script ends by Ctrl+C while a thread keeps making code from strings (as a late import
#: making a dataclass does), during a slow exit: CPython alone exits 1.
EXEC_DURING_EXIT = PROLOGUE + textwrap.dedent("""
    def make_code():
        while True:
            exec("x = 1")
            time.sleep(0.001)
    threading.Thread(target=make_code, daemon=True).start()
    atexit.register(time.sleep, 0.3)
    time.sleep(0.05)
    raise KeyboardInterrupt
""")

#: Ctrl+C lands in a slow exit hook: CPython alone prints "Exception ignored" and exits 0.
CTRL_C_IN_EXIT_HOOK = PROLOGUE + textwrap.dedent("""
    @atexit.register
    def slow_hook():
        print("IN EXIT HOOK", flush=True)
        time.sleep(30)
""")

CAUGHT = PROLOGUE + textwrap.dedent("""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        print("the script carries on")
""")


def run(script: str, tmp_path: Path, installed: bool = True) -> tuple[int, str]:
    """Exit status and what the script left in its unclosed file."""
    out = tmp_path / "unclosed.txt"
    done = subprocess.run([sys.executable, "-c", script, "installed" if installed else "no",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    return done.returncode, out.read_text()


@pytest.mark.parametrize("installed", [True, False])
def test_exec_in_another_thread_at_exit_does_not_lose_the_ctrl_c(tmp_path: Path,
                                                                 installed: bool) -> None:
    status, _ = run(EXEC_DURING_EXIT, tmp_path, installed)
    assert status == (-signal.SIGINT if installed else 1)  # CPython alone: 1


@pytest.mark.parametrize("installed", [True, False])
def test_a_ctrl_c_in_an_exit_hook_exits_by_sigint(tmp_path: Path, installed: bool) -> None:
    out = tmp_path / "unclosed.txt"
    child = subprocess.Popen([sys.executable, "-c", CTRL_C_IN_EXIT_HOOK,
                              "installed" if installed else "no", str(out)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "IN EXIT HOOK\n"
    child.send_signal(signal.SIGINT)  # while atexit sleeps (it would for 30 s)
    _, err = child.communicate(timeout=60)
    assert "Exception ignored in atexit callback" in err
    assert child.returncode == (-signal.SIGINT if installed else 0)  # CPython alone: 0
    assert out.read_text() == "flushed at exit\n"  # the interpreter still finalized


def test_a_ctrl_c_the_script_survives_changes_nothing(tmp_path: Path) -> None:
    assert run(CAUGHT, tmp_path) == (0, "flushed at exit\n")


def test_an_uncaught_ctrl_c_still_flushes_and_exits_by_sigint(tmp_path: Path) -> None:
    assert run(PROLOGUE + "raise KeyboardInterrupt\n", tmp_path) == (-signal.SIGINT,
                                                                    "flushed at exit\n")


def test_a_ctrl_c_at_the_interactive_prompt_does_not_end_the_session_by_sigint() -> None:
    install = "from skyward_iac.orchestration import interrupts; interrupts.install()"
    done = subprocess.run([sys.executable, "-i", "-c", install],
                          input="raise KeyboardInterrupt\nprint('still here')\n", cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert "still here" in done.stdout and done.returncode == 0, done.stderr
