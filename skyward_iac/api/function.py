"""``@sky.function`` and the lazy ``PendingFunction`` it produces; dispatch operators."""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import types
from collections.abc import Callable
from concurrent.futures import Future
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, TypeVarTuple, Unpack, overload

from skyward_iac.api.errors import ConfigError, NoActivePoolError

P = ParamSpec("P")
T = TypeVar("T")
U = TypeVar("U")
Ts = TypeVarTuple("Ts")


class Dispatcher(Protocol):
    """What a dispatch target provides; ``sky.Compute(...)`` yields one."""

    def run(self, pending: PendingFunction[T], *, target: None | str | int = None) -> T: ...

    def run_async(
        self, pending: PendingFunction[T], *, target: None | str | int = None
    ) -> Future[T]: ...

    def broadcast(self, pending: PendingFunction[T]) -> list[T]: ...

    def run_parallel(self, group: PendingFunctionGroup[Unpack[Ts]]) -> Any: ...


active_pool: ContextVar[Dispatcher | None] = ContextVar("skyward_active_pool", default=None)


def resolve_target(target: object, operator: str = ">>") -> Dispatcher:
    """The pool an operator's right-hand side names: a pool, or ``sky`` inside ``with``."""
    if isinstance(target, types.ModuleType):
        pool = active_pool.get()
        if pool is None:
            raise NoActivePoolError(
                f"`{operator} {target.__name__}` needs an active pool: use it inside "
                "`with sky.Compute(...) as pool:` or dispatch to the pool object itself"
            )
        return pool
    if all(hasattr(target, m) for m in ("run", "run_async", "broadcast", "run_parallel")):
        return target  # type: ignore[return-value]
    raise TypeError(f"cannot dispatch to {type(target).__name__!r}: expected a pool or `sky`")


@dataclass(frozen=True, slots=True)
class PendingFunction(Generic[T]):
    """A call of a ``@sky.function`` not run yet: ``(fn, args, kwargs, timeout)``.

    Nothing executes until an operator dispatches it: ``>>`` one node, ``@`` every node,
    ``>`` asynchronously.
    """

    fn: Callable[..., T]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None

    @property
    def name(self) -> str:
        """The function's qualified name, used in errors and events."""
        try:
            return self.fn.__qualname__  # read once a call: no repr made in advance
        except AttributeError:
            return repr(self.fn)

    def with_timeout(self, seconds: float) -> PendingFunction[T]:
        """A copy of this call with a wall-clock timeout in seconds."""
        return replace(self, timeout=_check_timeout(seconds))

    def __rshift__(self, target: object) -> T:
        return resolve_target(target).run(self)

    def __matmul__(self, target: object) -> list[T]:
        return resolve_target(target, "@").broadcast(self)

    def __gt__(self, target: object) -> Future[T]:
        return resolve_target(target, ">").run_async(self)

    def __and__(self, other: PendingFunction[U]) -> PendingFunctionGroup[T, U]:
        return PendingFunctionGroup((self, _pending(other)))


@dataclass(frozen=True, slots=True)
class PendingFunctionGroup(Generic[Unpack[Ts]]):
    """Calls to run in parallel: built by ``a() & b()`` or ``sky.gather(...)``.

    Only ``>>`` dispatches a group; the result is a tuple in submission order (each position
    keeps its own type), or a generator when ``stream=True``.
    """

    items: tuple[PendingFunction[Any], ...]
    stream: bool = False
    ordered: bool = True

    def __and__(self, other: PendingFunction[U]) -> PendingFunctionGroup[Unpack[Ts], U]:
        return PendingFunctionGroup((*self.items, _pending(other)), self.stream, self.ordered)

    def __rshift__(self, target: object) -> tuple[Unpack[Ts]]:
        return resolve_target(target).run_parallel(self)  # type: ignore[no-any-return]

    def __matmul__(self, target: object) -> Any:
        raise TypeError("a group runs with >> only; broadcast (@) takes a single call")

    def __gt__(self, target: object) -> Any:
        raise TypeError("a group runs with >> only; use > on a single call for a Future")

    def __len__(self) -> int:
        return len(self.items)


def gather(
    *pendings: PendingFunction[Any], stream: bool = False, ordered: bool = True
) -> PendingFunctionGroup[Unpack[tuple[Any, ...]]]:
    """Group calls to run in parallel: ``sky.gather(*calls) >> pool`` gives a tuple, or with
    ``stream=True`` a generator of results as they complete (``ordered=True`` keeps submission
    order while streaming, ``ordered=False`` yields in completion order)."""
    return PendingFunctionGroup(tuple(_pending(p) for p in pendings), stream, ordered)


def _pending(value: object) -> PendingFunction[Any]:
    if not isinstance(value, PendingFunction):
        raise TypeError(
            f"expected a call of a @sky.function (a PendingFunction), got {type(value).__name__}; "
            "did you forget to call it, or to decorate it?"
        )
    return value


def settle(value: Any) -> Any:
    """``value``, or, when it is a coroutine (what calling an ``async def`` gives), its result:
    run to completion on an event loop of its own. Used where a task runs (the worker) and by
    ``Function.local``, so an async function returns the same thing everywhere."""
    if not inspect.iscoroutine(value):
        return value
    import asyncio  # only for async functions: workers start without it

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(value)
    # This thread runs a loop already (a notebook's kernel, an async plugin): a loop cannot
    # be nested, so the coroutine runs on a thread of its own, in a copy of this context.
    box: list[Any] = []
    context = contextvars.copy_context()

    def run() -> None:
        try:
            box.append((True, context.run(asyncio.run, value)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box.append((False, exc))

    thread = threading.Thread(target=run, name="skyward-async-task")
    thread.start()
    thread.join()
    ok, outcome = box[0]
    if not ok:
        raise outcome
    return outcome


class AsyncCall:
    """An ``async def`` made a plain function: each call runs the coroutine to completion
    (``settle``) and returns its result. Plugins' task decorators and output filters then wrap
    the whole run, not just the creation of a coroutine."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return settle(self.fn(*args, **kwargs))

    def __repr__(self) -> str:
        return f"<async {getattr(self.fn, '__qualname__', self.fn)!r}>"


class Function(Generic[P, T]):
    """A function marked for remote execution; calling it returns a ``PendingFunction``.

    An ``async def`` is run to completion where the call runs (``asyncio.run`` on the node);
    the call's result is the coroutine's result.
    """

    def __init__(self, fn: Callable[P, T], timeout: float | None = None) -> None:
        fn = check_function(fn)
        if inspect.iscoroutinefunction(fn):
            fn = AsyncCall(fn)  # type: ignore[assignment]
        functools.update_wrapper(self, fn)  # first: it copies fn's __dict__ (an AsyncCall's fn)
        self.fn = fn
        self.timeout = timeout

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> PendingFunction[T]:
        return PendingFunction(self.fn, args, dict(kwargs), self.timeout)

    def local(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the function here, in this process; returns what a pool would (an ``async
        def``'s result, not a coroutine)."""
        return settle(self.fn(*args, **kwargs))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<sky.function {getattr(self.fn, '__qualname__', self.fn)}>"


@overload
def function(fn: Callable[P, T], /) -> Function[P, T]: ...
@overload
def function(*, timeout: float | None = None) -> Callable[[Callable[P, T]], Function[P, T]]: ...


def function(
    fn: Callable[P, T] | None = None, /, *, timeout: float | None = None
) -> Function[P, T] | Callable[[Callable[P, T]], Function[P, T]]:
    """Mark ``fn`` for remote execution: ``@sky.function`` or ``@sky.function(timeout=600)``.

    Plain functions and ``async def`` functions are accepted (a coroutine runs to completion on
    the node); generators are refused, since a generator cannot travel back from a node.
    Every argument is checked here, at decoration, with a ``sky.ConfigError`` saying what is
    accepted.
    """
    if timeout is not None:
        timeout = _check_timeout(timeout)
    if fn is None:
        return lambda f: _remote(f, timeout)
    if isinstance(fn, (int, float)) and not isinstance(fn, bool):
        raise ConfigError(f"@sky.function takes its timeout by name: write "
                          f"@sky.function(timeout={fn!r})")
    return _remote(fn, timeout)


def _remote(fn: Any, timeout: float | None) -> Function[Any, Any]:
    if isinstance(fn, Function):  # decorated twice: one Function, the outer timeout wins
        return Function(fn.fn, timeout if timeout is not None else fn.timeout)
    return Function(fn, timeout)


def check_function(fn: Any) -> Any:
    """``fn`` when a node can run it and send its result back; else a ``ConfigError``."""
    if not callable(fn):
        raise ConfigError(f"@sky.function needs a function, got {type(fn).__name__} "
                          f"({fn!r:.60})")
    name = getattr(fn, "__qualname__", repr(fn))
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        kind = "an async generator" if inspect.isasyncgenfunction(fn) else "a generator"
        raise ConfigError(
            f"@sky.function cannot run {name}: it is {kind} (it yields), and a generator cannot "
            "travel back from a node. Return a list instead (collect what it yields), or "
            "stream results with sky.gather(..., stream=True)")
    return fn


def _check_timeout(seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ConfigError(f"timeout must be a positive number of seconds (an int or float, "
                          f"e.g. timeout=600 or sky.time.minutes(10)), got {seconds!r}")
    return float(seconds)
