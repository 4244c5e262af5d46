"""How to run a pool: ``Worker`` (per-node execution) and ``Options`` (operational knobs).

Frozen pydantic models validated on construction, like ``api/spec.py``'s ``Spec``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from skyward_iac.api.health import HealthChecker
from skyward_iac.api.log_config import LogConfig
from skyward_iac.api.model import UserModel
from skyward_iac.api.spec import MAX_TTL

SelectionStrategy = Literal["cheapest", "first"]
#: Options whose None means their default (see ``Options``).
_DEFAULTED = ("provision_timeout", "ssh_timeout", "ssh_retry_interval")


class Worker(UserModel):
    """Per-node execution: task slots, prefetching and the executor.

    ``concurrency`` tasks run at once on each node; ``buffer`` more are sent ahead so a node
    never waits for the client between short tasks. ``"auto"`` (the default) sends ahead about
    one round trip's worth of work, measured per node: nothing ahead of tasks that run longer
    than a round trip (fair: no task waits behind a long one while another node idles), up to
    64 ahead of trivial ones; an int fixes the number. ``executor="thread"`` runs tasks as
    threads of one worker process; ``"process"`` gives each slot its own process (CPU-bound
    pure Python scales across cores) and ``reuse_processes=False`` a fresh process per task.
    """

    positional = ("concurrency", "buffer", "executor", "reuse_processes")
    concurrency: int = Field(default=1, ge=1)
    buffer: int | Literal["auto"] = "auto"
    executor: Literal["auto", "thread", "process"] = "auto"
    reuse_processes: bool = True

    @field_validator("buffer")
    @classmethod
    def _buffer(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError("buffer must be 'auto' or an int >= 0")
        return value

    @property
    def fixed_buffer(self) -> int:
        """The tasks always sent ahead (0 for "auto", whose extra is measured per node)."""
        return self.buffer if isinstance(self.buffer, int) else 0

    @property
    def resolved_executor(self) -> Literal["thread", "process"]:
        """``auto`` means thread."""
        return "process" if self.executor == "process" else "thread"


_TAG_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_TAG_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


class Options(UserModel):
    """Operational knobs of a pool; defaults are sensible."""

    worker: Worker = Field(default_factory=Worker)
    default_compute_timeout: float = Field(default=300.0, gt=0)
    #: These three are resolved here, once: None (accepted from configs written when they
    #: were optional) means the default, so every reader gets a number (``_DEFAULTED``).
    provision_timeout: float = Field(default=600.0, gt=0)
    ssh_timeout: float = Field(default=30.0, gt=0)
    #: Seconds between attempts to reach a node over SSH.
    ssh_retry_interval: float = Field(default=1.0, gt=0)
    #: Seconds between stack updates tried after a capacity refusal; before the first retry
    #: of a failed node start or converge step (doubling). ``api/retry.py`` uses both.
    provision_retry_delay: float | None = Field(default=None, gt=0)
    #: Stack updates tried after capacity refusals (each node moved, each place: one), and
    #: consecutive failed starts of one node before the pool gives up on it.
    max_provision_attempts: int | None = Field(default=None, ge=1)
    bootstrap_timeout: float | None = Field(default=None, gt=0)
    shutdown_timeout: float = Field(default=120.0, gt=0)
    #: Which of several Specs ``sky.Compute(spec_a, spec_b)`` provisions: the ``"cheapest"``
    #: offer across all of them, or the ``"first"`` spec that has any offer.
    selection: SelectionStrategy = "cheapest"
    autoscale_cooldown: float = Field(default=30.0, ge=0)
    autoscale_idle_timeout: float = Field(default=60.0, ge=0)
    reconcile_tick_interval: float = Field(default=15.0, gt=0)
    retry_on_interruption: int = Field(
        default=3, ge=0, description="retries of a task whose node was lost (preempted, killed)")
    console: bool | Literal["rich", "log", "minimal", "silent"] = Field(
        default=True, description="True: a live view on a terminal, plain log lines otherwise")
    logging: LogConfig | bool = Field(
        default=True, description="True: INFO to ~/.skyward/logs/skyward.log (rotated)")
    keep_warm: float = Field(
        default=0, ge=0, le=7 * 86400,
        description="seconds a cleanly closed pool's nodes stay up, idle, for the next pool "
                    "with an equal spec (0: destroy at once)")
    gc_on_start: bool = Field(
        default=True, description="first destroy this machine's stacks whose owner is gone")
    max_lifetime: int | None = Field(
        default=None, ge=60, le=MAX_TTL,
        description="seconds after which the cloud deletes each node whatever happens (GCP "
                    "max_run_duration; on AWS the node powers itself off, which terminates "
                    "it); a backstop beside the ttl for a hung node. None: no cap")
    max_cost_usd: float | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="USD the pool may spend, from launch, at the catalog's rates (resizes and "
                    "fallbacks included): a warning at 80 %; at 100 % the pool is closed and "
                    "destroyed and its pending calls raise BudgetExceededError. The nodes "
                    "stop themselves at the same deadline if this client is gone. None: no "
                    "budget")
    cluster: bool | None = Field(
        default=None, description="False: no etcd and no collections for this pool")
    plan: str | None = Field(
        default=None,
        description="a plan file from `skyward-iac plan`: bring up exactly that reviewed "
                    "stack (pulumi up --plan); a pool that differs from it is refused")
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="your tags on the stack and every cloud resource (e.g. team, cost center); "
                    "lowercase letters, digits, '_' and '-', at most 63 characters each")
    health_checker: HealthChecker | None = Field(
        default=None, description="a probe run on every node; nodes failing it are replaced")

    @field_validator(*_DEFAULTED, mode="before")
    @classmethod
    def _default_for_none(cls, value: object, info: ValidationInfo) -> object:
        assert info.field_name is not None
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not _TAG_KEY.match(key) or key.startswith("skyward"):
                raise ValueError(f"tag keys must start with a lowercase letter and hold only "
                                 f"lowercase letters, digits, '_' and '-' (at most 63), and not "
                                 f"start with 'skyward'; got {key!r}")
            if not isinstance(text, str) or not _TAG_VALUE.match(text):
                raise ValueError(f"tag values must be lowercase letters, digits, '_' and '-' "
                                 f"(at most 63; GCP labels allow no more); got {key}={text!r}")
        return value

    @property
    def collections(self) -> bool:
        """Whether the pool runs etcd for the distributed collections (on unless cluster=False)."""
        return self.cluster is not False
