"""``@sky.function`` and the lazy ``PendingFunction`` it produces; dispatch operators."""

from __future__ import annotations

import functools
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
        return getattr(self.fn, "__qualname__", repr(self.fn))

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


class Function(Generic[P, T]):
    """A function marked for remote execution; calling it returns a ``PendingFunction``."""

    def __init__(self, fn: Callable[P, T], timeout: float | None = None) -> None:
        self.fn = fn
        self.timeout = timeout
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> PendingFunction[T]:
        return PendingFunction(self.fn, args, dict(kwargs), self.timeout)

    def local(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the original function here, in this process."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<sky.function {self.fn.__qualname__}>"


@overload
def function(fn: Callable[P, T], /) -> Function[P, T]: ...
@overload
def function(*, timeout: float | None = None) -> Callable[[Callable[P, T]], Function[P, T]]: ...


def function(
    fn: Callable[P, T] | None = None, /, *, timeout: float | None = None
) -> Function[P, T] | Callable[[Callable[P, T]], Function[P, T]]:
    """Mark ``fn`` for remote execution: ``@sky.function`` or ``@sky.function(timeout=600)``."""
    if timeout is not None:
        timeout = _check_timeout(timeout)
    if fn is not None:
        if not callable(fn):
            raise ConfigError(f"@sky.function needs a function, got {type(fn).__name__}")
        return Function(fn, timeout)
    return lambda f: Function(f, timeout)


def _check_timeout(seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {seconds!r}")
    return float(seconds)
