"""Mocked program runs (infra/programs/testing.py) between ``asyncio.run()`` calls."""

from __future__ import annotations

import asyncio
import gc

import pulumi

from skyward_iac.infra.programs.testing import ProgramMocks, run_program


def _open_loops() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects()
               if isinstance(o, asyncio.AbstractEventLoop) and not o.is_closed())


def test_mocked_runs_between_asyncio_runs_do_not_pile_up_event_loops() -> None:
    """Each ``asyncio.run()`` leaves no current loop, and Pulumi's mocked runs need one: they
    made a new loop each time and never closed it (an unclosed loop and its two self-pipe
    sockets per run, reported as ResourceWarnings wherever the collector at last found them).
    Now they reuse one."""

    def program() -> None:
        pulumi.export("answer", 42)

    def cycle() -> None:
        asyncio.run(asyncio.sleep(0))
        assert run_program(program, ProgramMocks())["answer"] == 42

    cycle()
    before = _open_loops()
    for _ in range(5):
        cycle()
    assert _open_loops() <= before
