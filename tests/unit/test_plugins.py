"""Plugins without I/O: the Plugin type, composition, and what each built-in installs, the
environment it sets and the commands it builds."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from collections.abc import Iterator

import pytest

import skyward_iac as sky
from skyward_iac.api.plugin import check_plugins
from skyward_iac.node.plugin_hooks import NodePlugins
from skyward_iac.plugins import Cluster, LaunchCommand, LaunchContext, Plugin
from skyward_iac.plugins._accelerate import launch_flags
from skyward_iac.plugins._client import (
    bootstrap_steps,
    check_workers,
    transformed_spec,
)
from skyward_iac.plugins._gpu import mig_uuids, mps_env
from skyward_iac.plugins._jax import distributed_env as jax_env
from skyward_iac.plugins._support import RENDEZVOUS_BASE, RENDEZVOUS_SPAN, rendezvous_port
from skyward_iac.plugins._torch import distributed_env as torch_env

LOCAL = sky.Spec(provider=sky.Local(), nodes=2)
GPU = sky.Spec(provider=sky.AWS(), accelerator=sky.accelerators.A100(), nodes=2)


def info(node: int = 1, nodes: int = 2, per_node: int = 1, worker: int = 0,
         accelerators: float = 0) -> sky.InstanceInfo:
    peers = [sky.PeerInfo(node=i, private_ip=f"10.0.0.{i + 1}", public_ip="") for i in range(nodes)]
    return sky.InstanceInfo(node=node, worker=worker, total_nodes=nodes,
                            workers_per_node=per_node, head_addr="10.0.0.1", head_port=2379,
                            job_id="aws-me-20260101-abc", peers=peers, accelerators=accelerators)


def image_for(spec: sky.Spec, *plugins: Plugin) -> sky.Image:
    spec = spec.model_copy(update={"plugins": plugins})
    return transformed_spec(spec, "stack-1", spec.nodes.desired).image


# ---- the Plugin type and composition ---------------------------------------------------------

def test_builders_return_new_frozen_plugins() -> None:
    base = Plugin.create("p")
    built = base.with_decorator(lambda fn: fn).with_launcher(lambda c, ctx: c)
    assert base.decorate is None and built.decorate is not None and built.launcher is not None
    with pytest.raises(AttributeError):
        built.name = "q"  # type: ignore[misc]
    assert built.runs_on_nodes and not Plugin.create("x").runs_on_nodes
    shipped = built.with_image_transform(lambda i, c: i).for_nodes()
    assert shipped.transform is None and shipped.decorate is built.decorate


def test_bad_plugins_are_refused_with_their_position() -> None:
    with pytest.raises(ValueError, match="non-empty name"):
        Plugin.create(" ")
    with pytest.raises(TypeError, match="decorate must be callable"):
        Plugin(name="p", decorate="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"plugins\[1\] is .* \(call it"):
        check_plugins([sky.plugins.torch(), sky.plugins.jax])
    with pytest.raises(ValueError, match="distinct names"):
        check_plugins([sky.plugins.torch(), sky.plugins.torch()])
    with pytest.raises(sky.ConfigError, match="plugins"):
        sky.Compute(provider=sky.Local(), plugins="torch")


def test_spec_takes_a_list_or_tuple() -> None:
    torch = sky.plugins.torch()
    assert sky.Spec(provider=sky.Local(), plugins=[torch]).plugins == (torch,)
    assert sky.Spec(provider=sky.Local(), plugins=(torch,)).plugins == (torch,)


def test_transforms_and_bootstrap_steps_compose_in_order() -> None:
    def tag(name: str):  # noqa: ANN202
        return lambda image, cluster: image.model_copy(
            update={"pip": (*image.pip, f"{name}-{cluster.nodes}")})

    a = Plugin.create("a").with_image_transform(tag("a")).with_bootstrap(lambda c: ("echo a",))
    b = Plugin.create("b c").with_image_transform(tag("b")).with_bootstrap(
        lambda c: (f"echo {c.name}", "true"))
    spec = LOCAL.model_copy(update={"plugins": (a, b)})
    assert transformed_spec(spec, "s", 2).image.pip == ("a-2", "b-2")
    assert bootstrap_steps(spec, "s", 2) == (
        ("plugin a", "echo a"), ("plugin b-c", "echo s"), ("plugin b-c", "true"))


def test_a_hook_returning_the_wrong_thing_names_its_plugin() -> None:
    bad = Plugin.create("oops").with_bootstrap(lambda c: "echo not-a-tuple")
    with pytest.raises(sky.PluginError, match="'oops' failed in its bootstrap hook"):
        bootstrap_steps(LOCAL.model_copy(update={"plugins": (bad,)}), "s", 1)
    bad = Plugin.create("oops").with_image_transform(lambda image, c: None)
    with pytest.raises(sky.PluginError, match="'oops' failed in its transform hook.*sky.Image"):
        transformed_spec(LOCAL.model_copy(update={"plugins": (bad,)}), "s", 1)


def test_node_hooks_compose_in_order() -> None:
    events: list[str] = []

    def around(name: str):  # noqa: ANN202
        @contextlib.contextmanager
        def enter(_: sky.InstanceInfo) -> Iterator[None]:
            events.append(f"enter {name}")
            yield
            events.append(f"exit {name}")

        return enter

    def wrap(name: str):  # noqa: ANN202
        return lambda fn: lambda: f"{name}({fn()})"

    plugins = NodePlugins([
        Plugin.create(n).with_around_process(around(n)).with_decorator(wrap(n))
        .with_launcher(lambda c, ctx, n=n: c.wrapped(n))
        for n in ("a", "b")
    ])
    plugins.enter_process(info())
    plugins.close()
    assert events == ["enter a", "enter b", "exit b", "exit a"]
    assert plugins.decorate(lambda: "x")() == "a(b(x))"
    command = plugins.launch(LaunchCommand(("python", "-m", "w")), LaunchContext(info(), 0))
    assert command.argv == ("b", "a", "python", "-m", "w")


def test_a_failing_decorator_names_its_plugin() -> None:
    def broken(fn):  # noqa: ANN001, ANN202
        raise RuntimeError("boom")

    plugins = NodePlugins([Plugin.create("wrapper").with_decorator(broken)])
    with pytest.raises(sky.PluginError, match="'wrapper' failed in its decorate hook"):
        plugins.decorate(print)


def test_rendezvous_port_is_per_pool_and_clear_of_etcd() -> None:
    ports = {rendezvous_port(f"local-me-{i}") for i in range(200)}
    assert len(ports) > 150
    assert all(RENDEZVOUS_BASE <= p < RENDEZVOUS_BASE + RENDEZVOUS_SPAN for p in ports)
    assert rendezvous_port("x") == rendezvous_port("x") != rendezvous_port("x", 1)


# ---- torch -------------------------------------------------------------------------------------

def test_torch_on_local_comes_from_pypi_and_uses_gloo_over_loopback() -> None:
    image = image_for(LOCAL, sky.plugins.torch(version="2.15.0", vision="latest"))
    assert image.pip == ("torch==2.15.0", "torchvision")
    assert image.pip_indexes == ()
    assert image.env == {"SKYWARD_TORCH_BACKEND": "gloo", "GLOO_SOCKET_IFNAME": "lo"}


def test_torch_on_a_gpu_cloud_comes_from_the_cuda_index_with_nccl() -> None:
    image = image_for(GPU, sky.plugins.torch(cuda="cu126", audio="2.9.0"))
    assert image.pip == ("torch", "torchaudio==2.9.0")
    (index,) = image.pip_indexes
    assert index.url == "https://download.pytorch.org/whl/cu126"
    assert index.packages == ("torch", "torchaudio")
    assert image.env["SKYWARD_TORCH_BACKEND"] == "nccl"
    assert image.env["NCCL_SOCKET_IFNAME"] == "^lo,docker0"
    with pytest.raises(ValueError, match="cu128"):
        sky.plugins.torch(cuda="12.8")


def test_torch_env_of_each_worker() -> None:
    assert torch_env(info(node=1, nodes=2, per_node=2, worker=1)) == {
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": str(rendezvous_port("aws-me-20260101-abc")),
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1",
    }
    plugin = sky.plugins.torch()
    before = os.environ.get("RANK")
    with plugin.around_process(info(node=1)):  # type: ignore[misc]
        assert os.environ["RANK"] == "1" and os.environ["WORLD_SIZE"] == "2"
    assert os.environ.get("RANK") == before


def test_torch_and_jax_tasks_see_the_current_head_after_a_replacement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """around_process runs once per worker process; the task decorator re-reads the bound
    InstanceInfo, so a replaced head's new address reaches later tasks."""
    from skyward_iac.api import runtime

    monkeypatch.setattr(runtime, "_process_instance", [])
    for name in ("MASTER_ADDR", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(name, raising=False)

    def addresses() -> tuple[str, str]:
        return os.environ["MASTER_ADDR"], os.environ["JAX_COORDINATOR_ADDRESS"]

    task = addresses
    for plugin in (sky.plugins.torch(), sky.plugins.jax()):
        task = plugin.decorate(task)  # type: ignore[misc]
    runtime.bind_instance(info())
    assert task()[0] == "10.0.0.1" and task()[1].startswith("10.0.0.1:")
    moved = info().model_copy(update={"head_addr": "10.0.0.9"})
    runtime.bind_instance(moved)
    assert task()[0] == "10.0.0.9" and task()[1].startswith("10.0.0.9:")


def test_an_image_setting_wins_over_the_plugin() -> None:
    spec = LOCAL.model_copy(update={"image": sky.Image(pip=["torch==2.4.0"],
                                                       env={"GLOO_SOCKET_IFNAME": "eth0"})})
    image = image_for(spec, sky.plugins.torch())
    assert image.pip == ("torch==2.4.0",)
    assert image.env["GLOO_SOCKET_IFNAME"] == "eth0"


# ---- jax, keras, accelerate ---------------------------------------------------------------------

def test_jax_installs_the_right_build_and_points_at_the_head() -> None:
    assert image_for(LOCAL, sky.plugins.jax(version="0.10.2")).pip == ("jax==0.10.2",)
    assert image_for(GPU, sky.plugins.jax(cuda="cu124")).pip == ("jax[cuda12]",)
    env = jax_env(info(node=1, nodes=3))
    port = rendezvous_port("aws-me-20260101-abc", 1)
    assert env == {"JAX_COORDINATOR_ADDRESS": f"10.0.0.1:{port}", "JAX_NUM_PROCESSES": "3",
                   "JAX_PROCESS_ID": "1"}


def test_keras_selects_its_backend() -> None:
    image = image_for(LOCAL, sky.plugins.keras(backend="torch"))
    assert image.pip == ("keras",) and image.env == {"KERAS_BACKEND": "torch"}
    assert image_for(LOCAL, sky.plugins.keras(backend="tensorflow")).pip == ("keras", "tensorflow")
    with pytest.raises(ValueError, match="'jax', 'torch' or 'tensorflow'"):
        sky.plugins.keras(backend="mxnet")  # type: ignore[arg-type]


def test_accelerate_launch_flags_span_the_cluster() -> None:
    config = {"mixed_precision": "bf16", "distributed_type": "FSDP",
              "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_offload_params": False}}
    flags = launch_flags(config, info(node=1, nodes=2, per_node=4, accelerators=4))
    port = str(rendezvous_port("aws-me-20260101-abc"))
    assert flags == [
        "--num_processes", "8", "--num_machines", "2", "--machine_rank", "1",
        "--main_process_ip", "10.0.0.1", "--main_process_port", port, "--use_fsdp",
        "--mixed_precision", "bf16", "--fsdp_sharding_strategy", "FULL_SHARD",
        "--fsdp_offload_params", "false",
    ]
    cpu = launch_flags({"distributed_type": "MULTI_GPU"}, info())
    assert "--cpu" in cpu and "--multi_gpu" not in cpu  # accelerate takes only one of them
    assert image_for(LOCAL, sky.plugins.accelerate()).pip == ("accelerate",)
    assert sky.plugins.accelerate().launcher is not None
    with pytest.raises(ValueError, match="set by the pool"):
        sky.plugins.accelerate({"num_processes": 4})


# ---- joblib / sklearn -------------------------------------------------------------------------

def test_sklearn_pins_the_clients_versions() -> None:
    version = importlib.metadata.version
    image = image_for(LOCAL, sky.plugins.sklearn())
    assert image.pip == tuple(f"{name}=={version(name)}"
                              for name in ("scikit-learn", "joblib", "numpy", "scipy"))
    assert image_for(LOCAL, sky.plugins.joblib(version="1.5.0")).pip == ("joblib==1.5.0",)
    assert sky.plugins.sklearn().around_client is not None


# ---- GPU sharing --------------------------------------------------------------------------------

def test_mig_partitions_the_gpu_into_workers() -> None:
    plugin = sky.plugins.mig("3g.40gb")
    assert plugin.workers_per_node == 2
    cluster = Cluster("s", GPU, 2)
    assert plugin.bootstrap is not None
    assert plugin.bootstrap(cluster)[-1] == "nvidia-smi mig -i 0 -cgi 3g.40gb,3g.40gb -C"
    listing = ("GPU 0: NVIDIA A100 (UUID: GPU-1)\n"
               "  MIG 3g.40gb Device 0: (UUID: MIG-aaaa-1)\n"
               "  MIG 3g.40gb Device 1: (UUID: MIG-bbbb-2)\n")
    assert mig_uuids(listing) == ["MIG-aaaa-1", "MIG-bbbb-2"]
    with pytest.raises(ValueError, match="unknown MIG profile"):
        sky.plugins.mig("5g.50gb")
    with pytest.raises(sky.ConfigError, match=r"2 workers per node .*concurrency=2"):
        check_workers([plugin], sky.Worker())
    check_workers([plugin], sky.Worker(concurrency=2, executor="process"))


def test_mps_starts_the_daemon_and_limits_clients() -> None:
    plugin = sky.plugins.mps(active_thread_percentage=50, pinned_memory_limit="8G")
    assert plugin.bootstrap is not None
    assert "nvidia-cuda-mps-control -d" in plugin.bootstrap(Cluster("s", GPU, 1))[-1]
    assert mps_env(50, "8G") == {
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_LOG_DIRECTORY": "/tmp/nvidia-mps-log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8G"}
    with pytest.raises(ValueError, match="1-100"):
        sky.plugins.mps(active_thread_percentage=0)


def test_cuml_comes_from_nvidias_index() -> None:
    image = image_for(GPU, sky.plugins.cuml())
    assert image.pip == ("cuml-cu12",)
    (index,) = image.pip_indexes
    assert (index.url, index.packages) == ("https://pypi.nvidia.com", ("cuml-cu12",))


# ---- DistributedSampler -------------------------------------------------------------------------

@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_matches_shard_and_covers_the_dataset(drop_last: bool) -> None:
    data = list(range(11))
    samplers = [sky.DistributedSampler(data, seed=3, drop_last=drop_last, rank=r, num_replicas=3)
                for r in range(3)]
    for rank, sampler in enumerate(samplers):
        expected = sky.shard(data, shuffle=True, seed=3, drop_last=drop_last, node=rank,
                             total_nodes=3)
        assert list(sampler) == expected and len(sampler) == len(expected)
    seen = [i for sampler in samplers for i in sampler]
    assert len(set(seen)) == len(seen) == (9 if drop_last else 11)


def test_sampler_reshuffles_per_epoch_identically_everywhere() -> None:
    a = sky.DistributedSampler(range(100), rank=0, num_replicas=2)
    b = sky.DistributedSampler(range(100), rank=1, num_replicas=2)
    first = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) != first
    assert sorted(list(a) + list(b)) == list(range(100))
    assert list(sky.DistributedSampler(range(4), shuffle=False)) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="outside"):
        sky.DistributedSampler(range(4), rank=2, num_replicas=2)
