"""The seam the pool and the worker runtime use: current backend, factories, configs, keys.

No etcd here: a Backend opens no connection until a collection is read or written.
"""

from __future__ import annotations

import asyncio
import contextvars
import pickle
import threading
from collections.abc import Iterator

import pytest

from skyward_iac import collections as sky_collections
from skyward_iac.api.errors import ConfigError, NoActivePoolError, SkywardError
from skyward_iac.collections import (
    Backend,
    BackendConfig,
    CollectionsDisabledError,
    connect,
    context,
)
from skyward_iac.collections.base import async_twin
from skyward_iac.collections.namespace import Namespace, decode_value, encode_value, item_key
from skyward_iac.collections.store import resolve_consistency

FACTORIES = {
    "dict": lambda: sky_collections.dict("d"),
    "set": lambda: sky_collections.set("s", consistency="strong"),
    "counter": lambda: sky_collections.counter("c"),
    "queue": lambda: sky_collections.queue("q"),
    "barrier": lambda: sky_collections.barrier("b", 2),
    "lock": lambda: sky_collections.lock("l", timeout=5),
}


def _config(job_id: str = "job-1") -> BackendConfig:
    # Unreachable on purpose: nothing in these tests may talk to etcd.
    return BackendConfig(endpoints=("127.0.0.1:9",), job_id=job_id, ca_pem="CA-PEM",
                         cert_pem="CERT-PEM", key_pem="-----BEGIN PRIVATE KEY-----SECRET")


@pytest.fixture
def backend() -> Iterator[Backend]:
    with connect(_config()) as one:
        yield one


@pytest.fixture(autouse=True)
def nothing_bound() -> Iterator[None]:
    token = context.bind(None)
    context.set_process_default(None)
    yield
    context.set_process_default(None)
    context.unbind(token)


@pytest.mark.parametrize("kind", FACTORIES)
def test_factories_without_a_pool_raise_no_active_pool(kind: str) -> None:
    with pytest.raises(RuntimeError, match="^No active pool") as info:
        FACTORIES[kind]()
    assert isinstance(info.value, NoActivePoolError)
    assert "@sky.function" in str(info.value)


@pytest.mark.parametrize("kind", FACTORIES)
def test_factories_of_a_disabled_pool_raise_with_the_reason(kind: str) -> None:
    reason = "the pool was created with Options(cluster=False)"
    context.bind(connect(BackendConfig.disabled(reason)))
    with pytest.raises(RuntimeError, match=r"disabled.*cluster=False") as info:
        FACTORIES[kind]()
    assert isinstance(info.value, CollectionsDisabledError)
    assert isinstance(info.value, SkywardError)


@pytest.mark.parametrize("kind", FACTORIES)
def test_factories_resolve_the_bound_backend_lazily(kind: str, backend: Backend) -> None:
    context.bind(backend)
    proxy = FACTORIES[kind]()
    assert type(proxy).__name__.lower() == kind
    assert proxy.name == kind[0]


def test_default_consistencies(backend: Backend) -> None:
    assert backend.dict("x").consistency == "eventual"
    assert backend.set("x").consistency == "eventual"
    assert backend.counter("x").consistency == "eventual"
    assert backend.dict("x", consistency="strong").consistency == "strong"
    assert backend.queue("x").consistency == "strong"
    assert backend.lock("x").consistency == "strong"
    with pytest.raises(ConfigError, match="'strong' or 'eventual'"):
        backend.dict("x", consistency="linear")  # type: ignore[arg-type]
    assert resolve_consistency(None, "strong") == "strong"


def test_stores_are_shared_per_collection(backend: Backend) -> None:
    assert backend.dict("x")._store is backend.dict("x")._store
    assert backend.dict("x")._store is not backend.dict("x", consistency="strong")._store
    assert backend.dict("x")._store is not backend.set("x")._store


def test_bind_is_per_context_and_nests(backend: Backend) -> None:
    other = connect(_config("job-2"))
    outer = context.bind(backend)
    inner = context.bind(other)
    assert context.current() is other
    context.unbind(inner)
    assert context.current() is backend

    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(_current_or_error()))
    thread.start()
    thread.join()
    assert isinstance(seen[0], NoActivePoolError)  # a fresh thread has a fresh context
    copied = contextvars.copy_context()
    assert copied.run(context.current) is backend  # ...unless the runtime copies the context
    context.unbind(outer)
    other.close()


def test_process_default_serves_threads_and_yields_to_a_binding(backend: Backend) -> None:
    context.set_process_default(backend)
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(_current_or_error()))
    thread.start()
    thread.join()
    assert seen == [backend]
    other = connect(_config("job-2"))
    token = context.bind(other)
    assert context.current() is other
    context.unbind(token)
    other.close()


def test_a_backend_from_another_process_is_rebuilt_once(backend: Backend) -> None:
    context.set_process_default(backend)
    backend.pid = -1  # as if inherited through fork
    mine = context.current()
    assert mine is not backend and mine.config == backend.config
    assert context.current() is mine
    mine.close()


def test_config_is_picklable_and_its_repr_hides_keys() -> None:
    config = _config()
    assert pickle.loads(pickle.dumps(config)) == config
    assert "SECRET" not in repr(config) and "PEM" not in repr(config)
    assert "job-1" in repr(config)
    listed = BackendConfig(["h:1"], "j", "ca", "cert", "key")  # type: ignore[arg-type]
    assert listed.endpoints == ("h:1",) and hash(listed)
    disabled = BackendConfig.disabled("off")
    assert pickle.loads(pickle.dumps(disabled)).disabled_reason == "off"
    assert not connect(disabled).enabled


def test_closed_backend_says_so(backend: Backend) -> None:
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(SkywardError, match="closed"):
        backend.dict("x")


def test_namespace_keeps_jobs_kinds_and_names_apart() -> None:
    a, b = Namespace("job-a"), Namespace("job-ab")
    assert not b.prefix.startswith(a.prefix)
    assert a.collection("dict", "x") != a.collection("set", "x")
    assert not a.collection("dict", "xy").startswith(a.collection("dict", "x"))
    sneaky = a.collection("dict", "x/../../job-b")
    assert sneaky.startswith(a.prefix + "dict/") and sneaky.count("/") == a.prefix.count("/") + 2
    for bad in ("", "a/b"):
        with pytest.raises(ConfigError):
            Namespace(bad)
    with pytest.raises(ConfigError):
        a.collection("dict", "")


def test_item_keys_compare_by_type_and_value() -> None:
    keys = {item_key(v) for v in (1, 1.0, True, "1", b"1", (1,), None)}
    assert len(keys) == 7
    assert item_key("a/b") == item_key("a/b") and "/" not in item_key("a/b")
    assert item_key(("t", 1)) == item_key(("t", 1))
    assert item_key(lambda: None).startswith("h:")  # unpicklable by pickle: cloudpickle names it
    double = decode_value(encode_value(lambda x: 2 * x))
    assert double(4) == 8


def test_async_twin_runs_the_method_in_a_thread() -> None:
    class Thing:
        def work(self, x: int, *, y: int = 1) -> tuple[int, str]:
            return x + y, threading.current_thread().name

        work_async = async_twin(work)

    async def run() -> tuple[int, str]:
        return await Thing().work_async(1, y=2)

    value, thread = asyncio.run(run())
    assert value == 3 and thread != threading.main_thread().name
    assert "Async twin of ``work``" in (Thing.work_async.__doc__ or "")


def test_public_surface() -> None:
    assert set(sky_collections.__all__) >= {
        "bind", "unbind", "current", "set_process_default", "dict", "set", "counter", "queue",
        "barrier", "lock", "BackendConfig", "connect", "Backend"}
    for name in ("Dict", "Set", "Counter", "Queue", "Barrier", "Lock"):
        proxy_type = getattr(sky_collections, name)
        async_names = {n for n in vars(proxy_type) if n.endswith("_async")}
        assert async_names, f"{name} has no async twins"


def _current_or_error() -> object:
    try:
        return context.current()
    except NoActivePoolError as exc:
        return exc
