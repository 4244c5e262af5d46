"""@sky.function and PendingFunction: lazy, frozen, with timeouts and clear dispatch errors."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
from typing import Any

import pytest

import skyward_iac as sky


@sky.function
def add(a: int, b: int = 1) -> int:
    return a + b


def test_calling_returns_a_pending_function_without_running() -> None:
    pending = add(2, b=3)
    assert isinstance(pending, sky.PendingFunction)
    assert pending.args == (2,) and pending.kwargs == {"b": 3} and pending.timeout is None
    assert pending.name == "add"


def test_a_callable_without_a_qualified_name_is_named_by_its_repr() -> None:
    partial = functools.partial(pow, 2)  # no __qualname__
    assert sky.function(partial)(3).name == repr(partial)


def test_local_runs_the_original() -> None:
    assert add.local(2, b=5) == 7
    assert add.__name__ == "add"


def test_pending_is_frozen_and_with_timeout_copies() -> None:
    pending = add(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pending.timeout = 3  # type: ignore[misc]
    timed = pending.with_timeout(2)
    assert timed.timeout == 2.0 and pending.timeout is None


def test_decorator_with_timeout() -> None:
    @sky.function(timeout=30)
    def slow() -> None: ...

    assert slow().timeout == 30.0


@pytest.mark.parametrize("bad", [0, -1, "10", True])
def test_bad_timeouts_are_rejected(bad: object) -> None:
    with pytest.raises(sky.ConfigError, match="positive number of seconds"):
        add(1).with_timeout(bad)  # type: ignore[arg-type]


def test_dispatch_to_sky_outside_a_pool_explains_itself() -> None:
    # A fresh context: a pool shared by other tests in this session must not leak in.
    with pytest.raises(sky.NoActivePoolError, match="inside `with sky.Compute"):
        contextvars.Context().run(lambda: add(1) >> sky)


@pytest.mark.parametrize("dispatch, operator", [
    (lambda: add(1) >> sky, ">>"), (lambda: add(1) @ sky, "@"), (lambda: add(1) > sky, ">"),
])
def test_the_error_names_the_operator_used(dispatch: Any, operator: str) -> None:
    with pytest.raises(sky.NoActivePoolError, match=f"^`{operator} skyward_iac`"):
        contextvars.Context().run(dispatch)


def test_dispatch_to_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="cannot dispatch to 'int'"):
        add(1) >> 3


# ---- decoration-time checks (issue 29 item 8) ------------------------------------------------

def test_a_positional_timeout_says_to_name_it() -> None:
    with pytest.raises(sky.ConfigError, match=r"write @sky.function\(timeout=600\)"):
        sky.function(600)  # type: ignore[call-overload]


@pytest.mark.parametrize("bad", ["train", 3j, [print]])
def test_non_functions_are_refused_at_decoration(bad: object) -> None:
    decorate = sky.function(timeout=5)
    with pytest.raises(sky.ConfigError, match="@sky.function needs a function"):
        decorate(bad)  # type: ignore[arg-type]


def test_generators_are_refused_at_decoration_with_the_fix() -> None:
    def numbers() -> Any:
        yield 1

    async def agen() -> Any:
        yield 1

    with pytest.raises(sky.ConfigError, match="it is a generator .*Return a list instead"):
        sky.function(numbers)
    with pytest.raises(sky.ConfigError, match="it is an async generator"):
        sky.function(timeout=3)(agen)


def test_decorating_twice_gives_one_function_and_keeps_the_outer_timeout() -> None:
    twice = sky.function(timeout=7)(sky.function(timeout=3)(add.fn))
    again = sky.function(twice)
    assert twice.fn is add.fn and twice(1).timeout == 7.0
    assert again.fn is add.fn and again(1).timeout == 7.0


# ---- async def (issue 29 item 8) -------------------------------------------------------------

@sky.function
async def double_later(x: int) -> int:
    await asyncio.sleep(0.01)
    return 2 * x


def test_async_functions_are_plain_calls_that_run_the_coroutine() -> None:
    import inspect

    pending = double_later(21)
    assert pending.name == "double_later"
    # What travels is a plain function: calling it runs the coroutine and gives its result.
    assert not inspect.iscoroutinefunction(pending.fn)
    assert pending.fn(*pending.args) == 42
    assert double_later.local(5) == 10


def test_local_async_inside_a_running_event_loop() -> None:
    """A notebook runs an event loop in the kernel's thread: .local() still gives the result
    (the coroutine runs on a thread of its own) instead of 'cannot be called from a running
    event loop'."""
    async def inside() -> int:
        return double_later.local(4)

    assert asyncio.run(inside()) == 8


def test_an_async_function_that_raises_raises_its_own_error() -> None:
    @sky.function
    async def broken() -> None:
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        broken.local()


def test_the_worker_runs_an_async_function_and_pickles_its_result() -> None:
    """What the worker does with a call, end to end through pickling: the result, not a
    'cannot pickle coroutine' failure (a function hiding its async def is run too)."""
    from skyward_iac.node import protocol
    from skyward_iac.node.messages import Task
    from skyward_iac.node.worker import run_task
    from skyward_iac.remote.calls import pack_call

    hidden = functools.partial(double_later.fn.fn, 5)  # type: ignore[attr-defined]
    for pending, expected in ((double_later(21), 42), (sky.function(lambda: hidden())(), 10)):
        packed = pack_call(pending)
        result = run_task(Task(1, pending.name, packed.payload, None, packed.buffers))
        assert result.failure is None, result.failure
        assert protocol.loads(result.value or b"", result.buffers) == expected
