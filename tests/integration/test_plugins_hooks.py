"""A custom plugin using all seven hooks on a real Local pool: each is proved to have run, at
its moment, and two plugins compose in order."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.plugins import Cluster, LaunchCommand, LaunchContext, Plugin

pytestmark = pytest.mark.integration

#: What around_client saw, in order: ("enter", pool, cluster name) and ("exit", ...).
CLIENT_CALLS: list[tuple[str, Any, str]] = []


def add_env(name: str, image: sky.Image, cluster: Cluster) -> sky.Image:
    order = image.env.get("HOOK_ORDER", "")
    return image.model_copy(update={"env": {
        **image.env, "HOOK_TRANSFORM": f"{cluster.provider}:{cluster.nodes}",
        "HOOK_ORDER": f"{order},{name}".lstrip(","),
    }})


def bootstrap_ops(cluster: Cluster) -> tuple[str, ...]:
    # Runs in the node's workdir, which is also the agent's (and so the workers') cwd.
    return (f"echo {cluster.name} > plugin-bootstrap.txt",)


@contextlib.contextmanager
def around_app(info: sky.InstanceInfo) -> Iterator[None]:
    os.environ["HOOK_APP"] = f"{os.getpid()}:{info.node}"
    yield


def launcher(command: LaunchCommand, context: LaunchContext) -> LaunchCommand:
    return command.with_env(HOOK_LAUNCH=f"node{context.instance.node}-worker{context.worker}",
                            HOOK_ARGV0=os.path.basename(command.argv[0]))


@contextlib.contextmanager
def around_process(info: sky.InstanceInfo) -> Iterator[None]:
    os.environ["HOOK_PROCESS"] = str(os.getpid())
    yield


def tag(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return [name, fn(*args, **kwargs)]

    return run


@contextlib.contextmanager
def around_client(pool: sky.Pool, cluster: Cluster) -> Iterator[None]:
    CLIENT_CALLS.append(("enter", pool, cluster.name))
    yield
    CLIENT_CALLS.append(("exit", pool, cluster.name))


EVERY_HOOK = (
    Plugin.create("every-hook")
    .with_image_transform(functools.partial(add_env, "every-hook"))
    .with_bootstrap(bootstrap_ops)
    .with_decorator(functools.partial(tag, "every-hook"))
    .with_around_app(around_app)
    .with_around_process(around_process)
    .with_around_client(around_client)
    .with_launcher(launcher)
)
SECOND = (
    Plugin.create("second")
    .with_image_transform(functools.partial(add_env, "second"))
    .with_decorator(functools.partial(tag, "second"))
)


@sky.function
def observe() -> dict[str, Any]:
    with open("plugin-bootstrap.txt") as proof:
        bootstrap = proof.read().strip()
    env = {name: value for name, value in os.environ.items() if name.startswith("HOOK_")}
    return {"env": env, "pid": os.getpid(), "parent": os.getppid(), "bootstrap": bootstrap}


@pytest.fixture(scope="module")
def hooked() -> Iterator[tuple[sky.Pool, str]]:
    CLIENT_CALLS.clear()
    compute = sky.Compute(provider=sky.Local(), nodes=1, plugins=[EVERY_HOOK, SECOND],
                          options=sky.Options(default_compute_timeout=60))
    with compute as pool:
        yield pool, compute.stack_name


def test_every_hook_ran_at_its_moment(hooked: tuple[sky.Pool, str]) -> None:
    pool, stack = hooked
    second, (first, seen) = pool.run(observe())
    # decorate: the first plugin's decorator is the outermost.
    assert (second, first) == ("every-hook", "second")
    env = seen["env"]
    # transform: both plugins edited the image, in order, with the cluster they were given.
    assert env["HOOK_TRANSFORM"] == "local:1"
    assert env["HOOK_ORDER"] == "every-hook,second"
    # bootstrap: its shell step ran on the node before the agent started.
    assert seen["bootstrap"] == stack
    # around_app: entered in the agent (the worker's parent), before the worker started.
    assert env["HOOK_APP"] == f"{seen['parent']}:0"
    # launcher: the worker was started through the rewritten command.
    assert env["HOOK_LAUNCH"] == "node0-worker0"
    assert env["HOOK_ARGV0"].startswith("python")
    # around_process: entered in this very worker process.
    assert env["HOOK_PROCESS"] == str(seen["pid"])
    # around_client: entered on the client with this pool, not left yet.
    assert CLIENT_CALLS == [("enter", pool, stack)]


def test_around_client_is_left_when_the_pool_closes() -> None:
    calls: list[str] = []

    @contextlib.contextmanager
    def record(pool: sky.Pool, cluster: Cluster) -> Iterator[None]:
        calls.append("enter")
        yield
        calls.append("exit")

    plugin = Plugin.create("recorder").with_around_client(record)
    with sky.Compute(provider=sky.Local(), nodes=1, plugins=[plugin],
                     options=sky.Options(cluster=False)):
        assert calls == ["enter"]
    assert calls == ["enter", "exit"]


def test_a_failing_transform_names_its_plugin_before_provisioning() -> None:
    def broken(image: sky.Image, cluster: Cluster) -> sky.Image:
        raise RuntimeError("no such package index")

    plugin = Plugin.create("broken-index").with_image_transform(broken)
    with pytest.raises(sky.PluginError, match="'broken-index' failed in its transform hook"):
        sky.Compute(provider=sky.Local(), nodes=1, plugins=[plugin])
