"""A client whose own prints race the console, warnings and relayed remote output.

Usage: python interleaving_child.py MODE LINES, MODE a console mode. The main thread prints
LINES numbered lines, each in pieces (``print(..., end="")`` then the rest, ``sys.stdout.write``
twice, to stdout and to stderr), each ``user N ... end``; meanwhile one thread emits events the
console prints (multi-line errors among them), one relays remote output as a pool does (lines
without a final newline among them, as a task's last print leaves them), and one logs warnings
through skyward's stderr echo. Run with stdout and stderr on one file.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import skyward_iac as sky
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.console import acquire_console
from skyward_iac.observability.events import Error, StackProgress
from skyward_iac.observability.logging import configure_logging
from skyward_iac.orchestration.pool import print_output

STACK = "local-test-20260101-000000-abcdef"


def console_lines(bus: EventBus, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        bus.emit(StackProgress(stack=STACK, operation="up", name=f"node-{n}", type="x:LocalNode",
                               op="create", status="completed", done=n, started=n))
        bus.emit(Error(stack=STACK, message=f"console {n} first\nconsole {n} second"))
        time.sleep(0.0005)


def remote_output(stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        print_output(n % 3, "stdout", f"remote {n} whole\n")
        print_output(n % 3, "stderr", f"remote {n} no newline")  # a task's last print
        time.sleep(0.0005)


def warnings(stop: threading.Event) -> None:
    log = logging.getLogger("skyward")
    n = 0
    while not stop.is_set():
        n += 1
        log.warning("warning %d", n)
        time.sleep(0.002)


def main() -> None:
    mode, count = sys.argv[1], int(sys.argv[2])
    configure_logging(sky.LogConfig(file=None))  # warnings echoed to stderr
    bus = EventBus()
    release = acquire_console(mode, bus)
    stop = threading.Event()
    threads = [threading.Thread(target=target, args=args, daemon=True) for target, args in (
        (console_lines, (bus, stop)), (remote_output, (stop,)), (warnings, (stop,)))]
    for thread in threads:
        thread.start()
    for n in range(count):
        if n % 8 == 0:
            time.sleep(0.001)  # let the other threads in, mid-stream
        match n % 4:
            case 0:
                print(f"user {n} printed", end="")
                print(" in two pieces end")
            case 1:
                sys.stdout.write(f"user {n} written")
                sys.stdout.write(" in two writes end\n")
            case 2:
                print(f"user {n} to stderr", end="", file=sys.stderr)
                print(" in two pieces end", file=sys.stderr)
            case _:
                print(f"user {n} whole end")
    stop.set()
    for thread in threads:
        thread.join()
    release()
    print("DONE")


if __name__ == "__main__":
    main()
