"""The runtime API used inside tasks: where am I (``instance_info``), my slice of the data
(``shard``), and who may print (``stdout``/``stderr``/``silent``/``redirect_output``)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import random
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, computed_field

from skyward_iac.api.errors import ConfigError

T = TypeVar("T")


class PeerInfo(BaseModel):
    """One node of the pool as its peers see it."""

    model_config = ConfigDict(frozen=True)
    node: int
    private_ip: str
    public_ip: str


class AcceleratorInfo(BaseModel):
    """The accelerators of this node."""

    model_config = ConfigDict(frozen=True)
    type: str
    count: float
    memory_gb: float | None = None
    is_trainium: bool = False


class NetworkInfo(BaseModel):
    """The node's network interface towards the head node (told by the node itself) and its
    link speed in Gbit/s when the kernel reports one."""

    model_config = ConfigDict(frozen=True)
    interface: str = "lo"
    bandwidth_gbps: float | None = None


class InstanceInfo(BaseModel):
    """This worker's place in the pool (seed 003: ``sky.instance_info()``)."""

    model_config = ConfigDict(frozen=True)
    node: int
    worker: int = 0
    total_nodes: int
    workers_per_node: int = 1
    accelerators: float = 0
    total_accelerators: float = 0
    head_addr: str
    head_port: int
    job_id: str
    peers: list[PeerInfo]
    accelerator: AcceleratorInfo | None = None
    network: NetworkInfo = NetworkInfo()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def global_worker_index(self) -> int:
        return self.node * self.workers_per_node + self.worker

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total_workers(self) -> int:
        return self.total_nodes * self.workers_per_node

    @computed_field  # type: ignore[prop-decorator]
    @property
    def is_head(self) -> bool:
        return self.global_worker_index == 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hostname(self) -> str:
        return socket.gethostname()


_process_instance: list[InstanceInfo] = []  # set once per worker process; threads share it


def bind_instance(info: InstanceInfo) -> None:
    """Called by the worker: every task in this process sees ``info``."""
    _process_instance[:] = [info]


def instance_info() -> InstanceInfo | None:
    """This worker's ``InstanceInfo`` inside a task; ``None`` outside a pool."""
    return _process_instance[0] if _process_instance else None


def is_head(info: InstanceInfo | None = None) -> bool:
    """True on the single head worker (global worker index 0)."""
    info = info or instance_info()
    return bool(info and info.is_head)


def shard(
    *data: Any, shuffle: bool = False, seed: int = 0, drop_last: bool = False,
    node: int | None = None, total_nodes: int | None = None,
) -> Any:
    """This node's disjoint slice of each sequence (``indices[node::total_nodes]``).

    Keeps the input type (list, tuple, numpy array, torch tensor, any Sequence); with several
    arrays the slices are aligned and returned as a tuple. ``shuffle`` uses ``seed`` so every
    node draws the same permutation; ``drop_last`` gives every node the same count.
    """
    if not data:
        raise ValueError("shard() needs at least one sequence")
    info = instance_info()
    node = node if node is not None else (info.node if info else 0)
    total = total_nodes if total_nodes is not None else (info.total_nodes if info else 1)
    if not 0 <= node < total:
        raise ValueError(f"node {node} is outside 0..{total - 1}")
    length = len(data[0])
    if any(len(d) != length for d in data):
        raise ValueError(f"shard() needs sequences of equal length, got {[len(d) for d in data]}")
    indices = list(range(length))
    if shuffle:
        random.Random(seed).shuffle(indices)
    if drop_last:
        indices = indices[: length - length % total]
    mine = indices[node::total]
    slices = tuple(_take(d, mine) for d in data)
    return slices[0] if len(slices) == 1 else slices


def _take(data: Any, indices: list[int]) -> Any:
    kind = type(data).__module__.split(".")[0]
    if kind in ("numpy", "torch") or hasattr(data, "iloc"):
        return data.iloc[indices] if hasattr(data, "iloc") else data[indices]
    if isinstance(data, (list, tuple)):
        return type(data)(data[i] for i in indices)
    if isinstance(data, (str, bytes)):
        return type(data)().join(data[i : i + 1] for i in indices)  # type: ignore[arg-type]
    if isinstance(data, range):
        return [data[i] for i in indices]
    if isinstance(data, Sequence):
        try:
            return type(data)([data[i] for i in indices])  # type: ignore[call-arg]
        except TypeError:
            return [data[i] for i in indices]
    raise TypeError(f"shard() cannot slice {type(data).__name__}; pass a sequence")


# ---- output control -------------------------------------------------------------------------
# Per task, not per process: ``sys.stdout``/``sys.stderr`` are replaced once by ``RoutedStream``s,
# and where a write goes is read from a context variable, which each task (each thread, each
# ``contextvars`` context) sets for itself. A silenced task never mutes the task beside it.

Only = Literal["head"] | Callable[[InstanceInfo], bool]


class _Discard:
    """Where a silenced stream's text goes."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class _Routing:
    """Where the current context's output goes, per stream; None: where it went before."""

    stdout: Any = None
    stderr: Any = None


_PASS_THROUGH = _Routing()
_routing: ContextVar[_Routing] = ContextVar("skyward_output_routing", default=_PASS_THROUGH)
_install_lock = threading.Lock()


class RoutedStream:
    """A process's ``sys.stdout`` or ``sys.stderr`` under output control: each write goes where
    the writing context routes that stream (dropped, a callback), else to the stream it
    replaced. Everything else (``fileno``, ``isatty``, ``encoding``, ...) is the replaced
    stream's."""

    def __init__(self, name: Literal["stdout", "stderr"], inner: Any) -> None:
        self.name = name
        self.inner = inner

    def write(self, text: str) -> int:
        target = getattr(_routing.get(), self.name)
        return (self.inner if target is None else target).write(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        target = getattr(_routing.get(), self.name)
        (self.inner if target is None else target).flush()

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)


def route_output() -> None:
    """Put ``RoutedStream``s in front of ``sys.stdout`` and ``sys.stderr`` (once; a stream
    replaced since is wrapped again). The worker calls it at start; output control calls it
    before routing anything, so it also works outside a pool."""
    with _install_lock:
        for name in ("stdout", "stderr"):
            current = getattr(sys, name)
            if not isinstance(current, RoutedStream):
                setattr(sys, name, RoutedStream(name, current))  # type: ignore[arg-type]


@contextlib.contextmanager
def _routed(stdout: Any = None, stderr: Any = None) -> Iterator[None]:
    """Route this context's streams (None: leave that stream as it is) for the block."""
    route_output()
    current = _routing.get()
    token = _routing.set(_Routing(stdout if stdout is not None else current.stdout,
                                  stderr if stderr is not None else current.stderr))
    try:
        yield
    finally:
        _routing.reset(token)


def _allowed(only: Only) -> bool:
    info = instance_info()
    if info is None:
        return True  # not in a pool (e.g. ``.local()``): nothing to filter
    return info.is_head if only == "head" else bool(only(info))  # type: ignore[operator]


@contextlib.contextmanager
def _filtering(stdout: Only | None, stderr: Only | None) -> Iterator[None]:
    """Drop this context's stdout/stderr for the block where ``stdout``/``stderr`` says no."""
    mute_out = stdout is not None and not _allowed(stdout)
    mute_err = stderr is not None and not _allowed(stderr)
    if not (mute_out or mute_err):
        yield
        return
    with _routed(_Discard() if mute_out else None, _Discard() if mute_err else None):
        yield


def _filtered(fn: Callable[..., T], stdout: Only | None, stderr: Only | None) -> Callable[..., T]:
    if inspect.iscoroutinefunction(fn):
        # Still a coroutine function, filtered while the coroutine runs (not only while it
        # is created), so ``@sky.function`` above it runs it on the node like any other.
        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with _filtering(stdout, stderr):
                return await fn(*args, **kwargs)

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        with _filtering(stdout, stderr):
            return fn(*args, **kwargs)

    return run


def _output_decorator(stdout: Only | None, stderr: Only | None,
                      name: str) -> Callable[[Any], Any]:
    def decorate(target: Any) -> Any:
        from skyward_iac.api.function import Function

        if isinstance(target, Function):
            return Function(_filtered(target.fn, stdout, stderr), target.timeout)
        if not callable(target):
            raise ConfigError(f"@sky.{name} decorates a function or a @sky.function, got "
                              f"{type(target).__name__} ({target!r:.60})")
        return _filtered(target, stdout, stderr)

    return decorate


def _check_only(only: Any, name: str) -> Only:
    """``only`` when it is ``"head"`` or a predicate taking an InstanceInfo; else a
    ``ConfigError`` saying so, at decoration (not on the node, after provisioning)."""
    accepted = (f"@sky.{name}(only=...) takes \"head\" or a predicate on sky.InstanceInfo, "
                f"e.g. only=lambda info: info.node < 2")
    if isinstance(only, str):
        if only != "head":
            raise ConfigError(f"{accepted}; got the string {only!r}")
        return "head"
    if not callable(only):
        raise ConfigError(f"{accepted}; got {type(only).__name__} {only!r:.60}")
    try:
        inspect.signature(only).bind(None)
    except TypeError:
        raise ConfigError(f"{accepted}; {getattr(only, '__qualname__', only)!r} cannot be "
                          "called with one argument (the node's InstanceInfo)") from None
    except ValueError:
        pass  # no signature to check (some builtins): it is called as it is
    return only  # type: ignore[no-any-return]


def _misused_factory(name: str, args: tuple[Any, ...]) -> ConfigError:
    """The error for ``@sky.stdout`` without ``only=`` (or with positional arguments)."""
    usage = f'@sky.{name}(only="head") or @sky.{name}(only=lambda info: info.node < 2)'
    if not args:
        return ConfigError(f"sky.{name} needs only=: {usage}")
    if len(args) == 1 and callable(args[0]):
        return ConfigError(f"sky.{name} is a decorator factory: write {usage}, not @sky.{name}")
    return ConfigError(f"sky.{name} takes only= by name: {usage}; got {len(args)} positional "
                       "argument(s)")


def stdout(*args: Any, only: Only | None = None) -> Callable[[Any], Any]:
    """Keep a task's stdout only where ``only`` holds (``"head"`` or a predicate on InstanceInfo).

    It applies to that task alone: other tasks running at the same time print as usual.
    A bad ``only`` is a ``sky.ConfigError`` here, at decoration."""
    if args or only is None:
        raise _misused_factory("stdout", args)
    return _output_decorator(_check_only(only, "stdout"), None, "stdout")


def stderr(*args: Any, only: Only | None = None) -> Callable[[Any], Any]:
    """Keep a task's stderr only where ``only`` holds (that task alone)."""
    if args or only is None:
        raise _misused_factory("stderr", args)
    return _output_decorator(None, _check_only(only, "stderr"), "stderr")


def _never(_info: InstanceInfo) -> bool:
    return False


def silent(target: Any = None) -> Any:
    """Silence both streams of a task (a bare decorator, ``@sky.silent``; that task alone).

    ``@sky.silent()`` is accepted too."""
    decorate = _output_decorator(_never, _never, "silent")
    return decorate if target is None else decorate(target)


class CallbackWriter(io.TextIOBase):
    """A text stream that hands every write to a callback."""

    def __init__(self, callback: Callable[[str], Any]) -> None:
        self.callback = callback

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self.callback(text)
        return len(text)


@contextlib.contextmanager
def redirect_output(callback: Callable[[str], Any]) -> Iterator[tuple[CallbackWriter, CallbackWriter]]:
    """Route stdout and stderr to ``callback(text)`` for the block; yields the two writers.

    Only what the current task (the current thread or context) prints is routed; tasks
    running beside it print as usual."""
    out, err = CallbackWriter(callback), CallbackWriter(callback)
    with _routed(out, err):
        yield out, err


__all__ = [
    "AcceleratorInfo", "CallbackWriter", "InstanceInfo", "NetworkInfo", "PeerInfo",
    "instance_info", "is_head", "redirect_output", "shard", "silent", "stderr", "stdout",
]
