"""``sky.plugins.accelerate``: Hugging Face Accelerate (FSDP, DeepSpeed, mixed precision)
across the pool, as ``accelerate launch`` would set it up.

The worker is not re-executed through the ``accelerate`` CLI: its launcher closes every
inherited descriptor, and a worker reaches its agent through one. Instead the launcher hook
parses the same ``accelerate launch`` flags with Accelerate's own parser and gives the worker
exactly the environment ``accelerate launch`` would give its script, so ``Accelerator()``
inside a broadcast task finds the whole cluster (``num_processes`` = every worker).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from skyward_iac.api.plugin import LaunchCommand, LaunchContext, Plugin
from skyward_iac.api.runtime import InstanceInfo
from skyward_iac.plugins._support import rendezvous_port, requirement, with_packages

#: ``distributed_type`` of an Accelerate config -> the ``accelerate launch`` flag it means.
DISTRIBUTED_FLAGS = {"MULTI_GPU": "--multi_gpu", "FSDP": "--use_fsdp",
                     "DEEPSPEED": "--use_deepspeed", "MULTI_CPU": "--cpu"}
#: Keys the pool decides (they describe the cluster, not the training).
CLUSTER_KEYS = {"num_processes", "num_machines", "machine_rank", "main_process_ip",
                "main_process_port"}


def accelerate(config: Mapping[str, Any] | None = None, *, version: str = "latest") -> Plugin:
    """Install Accelerate and launch every worker as ``accelerate launch`` would.

    ``config`` mirrors the YAML of ``accelerate config`` (``mixed_precision``,
    ``distributed_type``, ``fsdp_config``, ``deepspeed_config``, ...). The cluster keys
    (``num_processes`` = all workers of the pool, ``num_machines``, ``machine_rank``,
    ``main_process_ip`` = the head, ``main_process_port``) are set by the pool.
    """
    config = dict(config or {})
    clashing = CLUSTER_KEYS & set(config)
    if clashing:
        raise ValueError(f"accelerate(config=...): {sorted(clashing)} are set by the pool")
    distributed = config.get("distributed_type", "MULTI_GPU")
    if distributed not in DISTRIBUTED_FLAGS and distributed != "NO":
        raise ValueError(f"accelerate(config=...): distributed_type {distributed!r} is not one "
                         f"of {sorted(DISTRIBUTED_FLAGS)} or 'NO'")
    return (
        Plugin.create("accelerate")
        .with_image_transform(lambda image, cluster: with_packages(
            image, (requirement("accelerate", version),)))
        .with_launcher(functools.partial(_launch, config))
    )


def launch_flags(config: Mapping[str, Any], info: InstanceInfo) -> list[str]:
    """The ``accelerate launch`` flags for one node of the pool."""
    flags = [
        "--num_processes", str(info.total_workers),
        "--num_machines", str(info.total_nodes),
        "--machine_rank", str(info.node),
        "--main_process_ip", info.head_addr,
        "--main_process_port", str(rendezvous_port(info.job_id)),
    ]
    distributed = config.get("distributed_type", "MULTI_GPU")
    if info.accelerators == 0:
        flags.append("--cpu")  # CPU nodes: accelerate allows no other distributed flag
    elif distributed in DISTRIBUTED_FLAGS and info.total_workers > 1:
        flags.append(DISTRIBUTED_FLAGS[distributed])
    for key, value in config.items():
        if key == "distributed_type":
            continue
        items = value.items() if isinstance(value, Mapping) else [(key, value)]
        for name, item in items:
            flags += [f"--{name}", str(item).lower() if isinstance(item, bool) else str(item)]
    return flags


def accelerate_env(flags: list[str]) -> dict[str, str]:
    """The environment ``accelerate launch <flags>`` gives its script (Accelerate's own code)."""
    from accelerate.commands.launch import (  # type: ignore[import-not-found]
        _validate_launch_command,
        launch_command_parser,
    )
    from accelerate.utils.launch import (  # type: ignore[import-not-found]
        prepare_multi_gpu_env,
        prepare_simple_launcher_cmd_env,
    )

    args = launch_command_parser().parse_args([*flags, "skyward-worker"])
    args, _, _ = _validate_launch_command(args)
    if args.multi_gpu or args.use_fsdp or args.use_deepspeed:
        env = prepare_multi_gpu_env(args)
    else:
        _, env = prepare_simple_launcher_cmd_env(args)
    return {name: value for name, value in env.items() if isinstance(value, str)}


def _launch(config: Mapping[str, Any], command: LaunchCommand,
            context: LaunchContext) -> LaunchCommand:
    flags = launch_flags(config, context.instance)
    return command.with_env(**accelerate_env(flags), SKYWARD_ACCELERATE_FLAGS=" ".join(flags))
