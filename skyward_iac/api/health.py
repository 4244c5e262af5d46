"""``sky.HealthChecker``: a probe run on every node now and then; failing nodes are replaced."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field, field_validator

from skyward_iac.api.model import UserModel


class HealthChecker(UserModel):
    """Run ``check()`` on every node every ``interval`` seconds (``Options(health_checker=...)``).

    A check passes when it returns a truthy value within ``timeout`` seconds; it fails when it
    returns a falsy value, raises, or times out. After ``failures`` consecutive failures the node
    is replaced like a lost one (``InstancePreempted`` with the reason, then
    ``InstanceReplaced``); its running tasks are retried elsewhere. A node whose every slot is
    busy with user tasks is not probed that round (it is answering, and a probe would only
    queue behind them).
    """

    positional = ("check",)

    check: Callable[[], Any]
    interval: float = Field(default=30.0, gt=0)
    timeout: float = Field(default=10.0, gt=0)
    failures: int = Field(default=3, ge=1)

    @field_validator("check")
    @classmethod
    def _callable(cls, value: Any) -> Callable[[], Any]:
        if not callable(value):
            raise ValueError(f"check must be a callable taking no arguments, got {value!r}")
        return value
