"""``sky.Compute``, ``sky.Session``, ``@sky.pool`` and ``sky.MultiPool``: pools as stacks.

``Compute`` is a thin context manager: its constructor decides the pool (``plan.PoolPlan``:
validation, offer, stack name; nothing provisioned), ``__enter__`` hands the plan to a
``PoolLifecycle`` (the sequencer: cold start or adoption, run, close) that provisions it,
``__exit__`` closes that lifecycle, which always ends with the stack destroyed (or kept warm).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextvars import Token
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.function import Dispatcher, active_pool
from skyward_iac.api.options import Options
from skyward_iac.api.spec import Spec
from skyward_iac.collections import context as collections_context
from skyward_iac.infra.engine import locate as engine
from skyward_iac.observability.bus import EventBus, Subscription
from skyward_iac.observability.events import Event
from skyward_iac.orchestration import at_exit
from skyward_iac.orchestration.lifecycle import PoolLifecycle, ending
from skyward_iac.orchestration.plan import plan_pool
from skyward_iac.orchestration.pool import Pool, print_output

P = ParamSpec("P")
R = TypeVar("R")
#: Operational knobs people pass to Compute by mistake; they belong on ``sky.Options``.
_OPTION_FIELDS = frozenset(Options.model_fields)


class Compute:
    """Provision a pool as one Pulumi stack for the length of a ``with`` block.

    ``with sky.Compute(provider=sky.Local(), nodes=2) as pool:`` validates everything first,
    then creates the stack, brings it up, bootstraps the nodes and yields the ``Pool``. Leaving
    the block, by any path, closes the connections and destroys the stack.
    """

    def __init__(self, *specs: Spec, name: str | None = None, options: Options | None = None,
                 on_output: Callable[[int, str, str], Any] = print_output,
                 on_event: Callable[[Event], Any] | None = None, **fields: Any) -> None:
        if misplaced := sorted(_OPTION_FIELDS & set(fields)):
            raise ConfigError(
                f"{', '.join(misplaced)} belong(s) on sky.Options, not sky.Compute: "
                f"sky.Compute(..., options=sky.Options({misplaced[0]}=...))")
        #: Everything decided before provisioning (spec, offer, stack name, request).
        self.plan = plan_pool(specs, name, options, fields)
        engine.find_engine()  # a missing engine fails here, before provisioning
        self.on_output = on_output
        #: Every event of this pool; ``on_event``, ``on(...)`` and ``pool.on(...)`` subscribe.
        self.events = EventBus()
        if on_event is not None:
            self.events.subscribe(on_event)
        self.lifecycle: PoolLifecycle | None = None
        self._context: Token[Dispatcher | None] | None = None
        self._collections: Any = None

    @property
    def stack_name(self) -> str:
        """The pool's stack (a warm pool's, once one was adopted)."""
        return (self.lifecycle or self).plan.stack_name

    @property
    def spec(self) -> Spec:
        return self.plan.spec

    @property
    def options(self) -> Options:
        return self.plan.options

    @property
    def choice(self) -> Any:
        """The chosen spec's offer (instance type, region, market) and its price."""
        return self.plan.choice

    @property
    def request(self) -> Any:
        """The ``ClusterRequest`` in force (with any fallback it took)."""
        return self.lifecycle.request if self.lifecycle is not None else self.plan.request

    @property
    def pool(self) -> Pool | None:
        return self.lifecycle.pool if self.lifecycle is not None else None

    @property
    def timings(self) -> dict[str, float]:
        """Seconds spent in each phase: create, up, nodes (until ready), destroy."""
        return self.lifecycle.timings if self.lifecycle is not None else {}

    def on(self, event_type: type[Event], callback: Callable[[Any], Any]) -> Subscription:
        """Call ``callback(event)`` for every event of ``event_type``; works before entering,
        so provisioning events are seen too: ``sky.Compute(...).on(sky.ClusterReady, cb)``."""
        return self.events.subscribe(callback, event_type)

    def provision(self) -> Pool:
        """Create and bring up the stack and its nodes; on any failure destroy it again."""
        if self.lifecycle is not None:
            raise ConfigError(f"pool {self.stack_name} was provisioned already; "
                              "create a new sky.Compute for another pool")
        self.lifecycle = PoolLifecycle(self.plan, self.events, self.on_output)
        return self.lifecycle.start()

    def teardown(self, how: str = "pool closed") -> None:
        """Close the pool's connections and destroy the stack (the stack stays on record, its
        history saying ``how`` the run ended)."""
        if self.lifecycle is not None:
            self.lifecycle.close(how)

    def __enter__(self) -> Pool:
        pool = self.provision()
        self._context = active_pool.set(pool)
        # Bound lazily: with Nodes.min the head (etcd) may join after the pool is handed over.
        self._collections = collections_context.bind(lambda: pool.collections)
        return pool

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._context is not None:
            collections_context.unbind(self._collections)
            active_pool.reset(self._context)
            self._context = None
        self.teardown(ending(exc))


class Session:
    """Several pools with lifetimes of your choosing; every one is destroyed at ``close()``.

    ``with sky.Session() as session: a = session.compute(provider=sky.Local(), nodes=2)``

    A session never closed is closed when the script ends (``at_exit``): its pools are
    destroyed before the interpreter exits.
    """

    def __init__(self) -> None:
        #: This list object is the one ``at_exit`` watches: it is emptied, never replaced.
        self._computes: list[Compute] = []
        at_exit.track(self, self._computes)

    def compute(self, *specs: Spec, options: Options | None = None, **fields: Any) -> Pool:
        """Provision a pool now; it lives until ``release(pool)`` or the session closes."""
        compute = Compute(*specs, options=options, **fields)
        pool = compute.provision()
        self._computes.append(compute)
        return pool

    def release(self, pool: Pool) -> None:
        """Destroy one pool of this session now."""
        for compute in list(self._computes):
            if compute.pool is pool:
                self._computes.remove(compute)
                compute.teardown()
                return
        raise ConfigError(f"{pool!r} does not belong to this session")

    def close(self) -> None:
        """Destroy every pool still alive, concurrently."""
        computes = self._computes[:]
        self._computes.clear()
        _teardown_all(computes)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MultiPool:
    """Provision several ``Compute`` pools concurrently: ``with sky.MultiPool(a, b) as (p, q):``.

    Setup takes as long as the slowest pool, not the sum; all are destroyed on exit, and if one
    fails to come up the others are destroyed before the error is raised.
    """

    def __init__(self, *computes: Compute) -> None:
        if not computes or not all(isinstance(c, Compute) for c in computes):
            raise ConfigError("sky.MultiPool takes one or more sky.Compute(...) objects")
        self.computes = computes

    def __enter__(self) -> tuple[Pool, ...]:
        with ThreadPoolExecutor(max_workers=len(self.computes)) as threads:
            futures = [threads.submit(compute.provision) for compute in self.computes]
            try:
                errors = [f.exception() for f in futures if f.exception() is not None]
            except BaseException:
                self._close_when_provisioned(futures)
                raise
        if errors:
            _teardown_all(list(self.computes))
            raise errors[0]  # type: ignore[misc]
        return tuple(f.result() for f in futures)

    def __exit__(self, *exc: object) -> None:
        _teardown_all(list(self.computes))

    def _close_when_provisioned(self, futures: list[Future[Pool]]) -> None:
        """A Ctrl+C reached this thread while the pools came up in theirs (``__exit__`` will
        not run): once they have, destroy them all. A thread of its own does it, so a second
        Ctrl+C ends only the wait; the interpreter still waits for the destroys (an Event, not
        ``Thread.join``: a join a Ctrl+C interrupts marks the thread stopped on Python 3.11)."""
        closed = threading.Event()

        def close() -> None:
            try:
                wait(futures)
                _teardown_all(list(self.computes))
            finally:
                closed.set()

        threading.Thread(target=close, name="skyward-multipool-close").start()
        closed.wait()


def _teardown_all(computes: list[Compute]) -> None:
    with ThreadPoolExecutor(max_workers=max(1, len(computes))) as threads:
        for future in [threads.submit(c.teardown) for c in computes]:
            future.result()


def pool(*specs: Spec, options: Options | None = None,
         **fields: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: each call of the function runs inside its own ``with sky.Compute(...)``,
    so ``>> sky`` inside it reaches that pool. The spec is validated when decorating."""
    Compute(*specs, options=options, **fields)  # fail at decoration time, nothing provisioned

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with Compute(*specs, options=options, **fields):
                return fn(*args, **kwargs)

        return run

    return decorate
