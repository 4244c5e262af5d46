"""Per-stage timestamps of a round trip, for ``bench/agent_rtt.py --trace``.

Installed as ``sitecustomize`` (a directory on ``PYTHONPATH`` holding a copy of this file) in
the agent and, through its environment, in its workers; the client calls ``install`` itself.
It wraps ``protocol.send`` and ``protocol.read_frame_head``, the two ends of every hop, and
appends ``monotonic_ns pid thread event`` lines to ``$RTT_TRACE_DIR/<pid>.trace``. All the
processes are on one machine, so their monotonic clocks are one clock.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def install(directory: str) -> None:
    from skyward_iac.node import protocol

    out = open(os.path.join(directory, f"{os.getpid()}.trace"), "a")  # noqa: SIM115
    clock, current = time.monotonic_ns, threading.current_thread
    pid, held = os.getpid(), []

    def note(event: str) -> None:
        # Kept in memory (a write per event would time the writes), written every 1,000.
        held.append((clock(), current().name, event))
        if len(held) >= 1000:
            out.write("".join(f"{at} {pid} {name} {what}\n" for at, name, what in held))
            out.flush()
            held.clear()

    import atexit
    atexit.register(lambda: note("exit") or out.write(
        "".join(f"{at} {pid} {name} {what}\n" for at, name, what in held)))

    send, read_frame_head = protocol.send, protocol.read_frame_head

    def traced_send(stream: Any, frames: list[Any]) -> None:
        note("send>")
        send(stream, frames)
        note("send<")

    def traced_read(stream: Any) -> Any:
        head = read_frame_head(stream)
        note("read")
        return head

    protocol.send = traced_send  # type: ignore[assignment]
    protocol.read_frame_head = traced_read  # type: ignore[assignment]
    try:  # a small frame read ahead whole skips read_frame_head (node/read_ahead.py)
        from skyward_iac.node.read_ahead import ReadAhead
    except ImportError:  # a tree from before it
        pass
    else:
        small_frame = ReadAhead.small_frame

        def traced_small_frame(self: Any) -> Any:
            payload = small_frame(self)
            if payload is not None:
                note("read")
            return payload

        ReadAhead.small_frame = traced_small_frame  # type: ignore[method-assign]
    if os.environ.get("RTT_TRACE_DEEP"):  # the stages between a read and the next send
        from skyward_iac.node import relay, slots, worker

        for module, name in ((relay, "receive"), (slots.Slots, "submit_many"),
                             (slots.Slots, "_on_messages"), (relay, "deliver"),
                             (worker, "run_task"), (worker.Outbox, "send"),
                             (protocol, "encode"), (protocol, "unbatch")):
            setattr(module, name, _wrapped(getattr(module, name), name, note))
    globals()["note"] = note


def _wrapped(function: Any, name: str, note: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        note(name + ">")
        try:
            return function(*args, **kwargs)
        finally:
            note(name + "<")
    return wrapper


if os.environ.get("RTT_TRACE_DIR") and __name__ == "sitecustomize":
    install(os.environ["RTT_TRACE_DIR"])
