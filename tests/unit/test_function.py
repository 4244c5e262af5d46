"""@sky.function and PendingFunction: lazy, frozen, with timeouts and clear dispatch errors."""

from __future__ import annotations

import contextvars
import dataclasses
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
