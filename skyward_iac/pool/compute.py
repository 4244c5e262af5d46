"""``sky.Compute``: one pool = one Pulumi stack, up on enter, destroyed on exit.

The path reads straight through: Spec -> stack program -> ``up`` -> node addresses -> SSH ->
bootstrap -> agent -> tasks; and on the way out: agents closed -> ``destroy``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import Token
from types import TracebackType
from typing import Any, TypeVar

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.function import Dispatcher, PendingFunction, active_pool
from skyward_iac.api.spec import Options, Spec, validated
from skyward_iac.infra import engine
from skyward_iac.infra.programs import ClusterRequest, program_for
from skyward_iac.infra.stack import ClusterOutputs, ClusterStack, new_stack_name, stack_tags
from skyward_iac.pool.calls import pack_call
from skyward_iac.pool.node import Node, plan_for

T = TypeVar("T")
log = logging.getLogger("skyward")


class Pool(Dispatcher):
    """Ready nodes of one stack and the operations that run work on them."""

    def __init__(self, stack_name: str, nodes: list[Node], options: Options) -> None:
        self.stack_name = stack_name
        self.nodes = nodes
        self.options = options
        self._next = itertools.count()
        self._lock = threading.Lock()

    def current_nodes(self) -> int:
        """How many nodes are ready right now."""
        return len(self.nodes)

    def _pick(self, target: None | str | int) -> Node:
        if target is None:
            with self._lock:
                return self.nodes[next(self._next) % len(self.nodes)]
        if target == "head":
            return self.nodes[0]
        if isinstance(target, int) and not isinstance(target, bool) and 0 <= target < len(self.nodes):
            return self.nodes[target]
        raise ConfigError(
            f"target must be None, 'head' or a node rank in 0..{len(self.nodes) - 1}, got {target!r}"
        )

    def _submit(self, node: Node, pending: PendingFunction[T], payload: bytes) -> Future[T]:
        timeout = pending.timeout or self.options.default_compute_timeout
        return node.agent.submit(pending.name, payload, timeout)

    def run_async(self, pending: PendingFunction[T], *, target: None | str | int = None) -> Future[T]:
        """Start ``pending`` on one node (round-robin unless ``target``); returns a Future."""
        payload = pack_call(pending)
        return self._submit(self._pick(target), pending, payload)

    def run(self, pending: PendingFunction[T], *, target: None | str | int = None) -> T:
        """Run ``pending`` on one node and return its result (``pending >> pool``)."""
        return self.run_async(pending, target=target).result()

    def broadcast(self, pending: PendingFunction[T]) -> list[T]:
        """Run ``pending`` on every node; results in node order (``pending @ pool``)."""
        payload = pack_call(pending)
        futures = [self._submit(node, pending, payload) for node in self.nodes]
        return [future.result() for future in futures]

    def close(self) -> None:
        """Disconnect from every node."""
        for node in self.nodes:
            try:
                node.close()
            except Exception:  # noqa: BLE001 - closing the others matters more
                log.debug("closing node %s failed", node.address.index, exc_info=True)

    def __repr__(self) -> str:
        return f"<Pool {self.stack_name} nodes={len(self.nodes)}>"


def _resolve_spec(specs: tuple[Spec, ...], name: str | None, fields: dict[str, Any]) -> Spec:
    if name is not None:
        raise ConfigError("named pools (name=...) from skyward.toml are not supported yet; "
                          "pass the spec fields as keyword arguments")
    if specs and fields:
        raise ConfigError(
            "sky.Compute takes either Spec objects or spec fields as keyword arguments, not both "
            f"(got {len(specs)} Spec(s) and {sorted(fields)})"
        )
    if not specs:
        return validated(Spec, **fields)
    if not all(isinstance(s, Spec) for s in specs):
        raise ConfigError("positional arguments of sky.Compute must be sky.Spec objects")
    if len(specs) > 1:
        raise ConfigError("several Specs (provider fallback) are not supported yet; pass one")
    return specs[0]


class Compute:
    """Provision a pool as one Pulumi stack for the length of a ``with`` block.

    ``with sky.Compute(provider=sky.Local(), nodes=2) as pool:`` validates everything first,
    then creates the stack, brings it up, bootstraps every node and yields the ``Pool``. Leaving
    the block, by any path, closes the connections and destroys the stack.
    """

    def __init__(self, *specs: Spec, name: str | None = None, options: Options | None = None,
                 **fields: Any) -> None:
        self.spec = _resolve_spec(specs, name, fields)
        if options is not None and not isinstance(options, Options):
            raise ConfigError(f"options must be sky.Options(...), got {type(options).__name__}")
        self.options = options or Options()
        self.node_count = self.spec.nodes.desired
        self.stack_name = new_stack_name(self.spec)
        self.request = ClusterRequest(self.stack_name, self.spec, self.node_count)
        program_for(self.request)  # an unsupported provider fails here, before provisioning
        engine.find_engine()  # and so does a missing engine
        self.stack: ClusterStack | None = None
        self.pool: Pool | None = None
        #: Seconds spent in each phase: create, up, nodes (SSH + bootstrap + agent), destroy.
        self.timings: dict[str, float] = {}
        self._context: Token[Dispatcher | None] | None = None

    def __enter__(self) -> Pool:
        started = time.monotonic()
        try:
            with self._phase("create"):
                self.stack = ClusterStack.create(self.request, stack_tags(self.spec, self.node_count))
            log.info("stack %s: bringing up %d node(s)", self.stack_name, self.node_count)
            with self._phase("up"):
                outputs = self.stack.up()
            with self._phase("nodes"):
                self.pool = Pool(self.stack_name, self._start_nodes(outputs), self.options)
        except BaseException:
            self._teardown()
            raise
        log.info("pool %s ready in %.1fs (%s)", self.stack_name, time.monotonic() - started,
                 ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        self._context = active_pool.set(self.pool)
        return self.pool

    def _start_nodes(self, outputs: ClusterOutputs) -> list[Node]:
        with ThreadPoolExecutor(max_workers=len(outputs.nodes)) as threads:
            futures = [
                threads.submit(Node.start, address, outputs,
                               plan_for(address, self.spec, self.options), self.options.ssh_timeout)
                for address in outputs.nodes
            ]
            nodes, errors = [], []
            for future in futures:
                try:
                    nodes.append(future.result())
                except BaseException as exc:  # noqa: BLE001 - collected, the first is raised
                    errors.append(exc)
        if errors:
            for node in nodes:
                node.close()
            raise errors[0]
        return nodes

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._context is not None:
            active_pool.reset(self._context)
            self._context = None
        self._teardown()

    def _teardown(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.stack is not None:
            with self._phase("destroy"):
                self.stack.destroy()
            log.info("stack %s: destroyed in %.1fs", self.stack_name, self.timings["destroy"])

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = time.monotonic() - started
