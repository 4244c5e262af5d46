"""Bad input is a ``sky.ConfigError`` that names the field, raised before anything runs."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ConfigError
from skyward_iac.collections._barrier import Barrier
from skyward_iac.collections._lock import Lock
from skyward_iac.collections._queue import Queue
from skyward_iac.config_file import load_pool

BAD: dict[str, tuple[Callable[[], Any], str]] = {
    "Nodes(0)": (lambda: sky.Nodes(0), "desired"),
    "nodes=10**6": (lambda: sky.Spec(sky.Local(), nodes=10**6), "less than or equal to 1000"),
    "Nodes(min > desired)": (lambda: sky.Nodes(desired=2, min=3), "cannot exceed desired"),
    "Spec(provider='aws')": (lambda: sky.Spec(provider="aws"), "provider"),
    "ttl=-1": (lambda: sky.Spec(sky.Local(), ttl=-1), "ttl"),
    "ttl=10**12": (lambda: sky.Spec(sky.Local(), ttl=10**12), "at most 2592000"),
    "ttl=1": (lambda: sky.Spec(sky.Local(), ttl=1), "at least 3 seconds"),
    "Local + accelerator": (lambda: sky.Spec(sky.Local(), sky.accelerators.A100()),
                            "Local nodes have no accelerator"),
    "Image(python=3)": (lambda: sky.Image(python=3), "python"),
    "Options(bogus=1)": (lambda: sky.Options(bogus=1), "bogus"),
    "Options(retry_on_interruption=-1)": (lambda: sky.Options(retry_on_interruption=-1),
                                          "retry_on_interruption"),
    "Worker(0)": (lambda: sky.Worker(0), "concurrency"),
    "Worker(executor='gpu')": (lambda: sky.Worker(executor="gpu"), "executor"),
    "Volume(bucket='A B')": (lambda: sky.Volume("A B", "/data"), "bucket"),
    "HealthChecker(check=1)": (lambda: sky.HealthChecker(check=1), "check"),
    "HealthChecker(interval=0)": (lambda: sky.HealthChecker(lambda: 1, interval=0), "interval"),
    "AWS(region=3)": (lambda: sky.AWS(region=3), "region"),
    "GCP(bogus=1)": (lambda: sky.GCP(bogus=1), "bogus"),
    "Local(x=1)": (lambda: sky.Local(x=1), "x"),
    "A100(count=0)": (lambda: sky.accelerators.A100(count=0), "count"),
    "PipIndex(packages=[])": (lambda: sky.PipIndex(url="https://x/simple", packages=[]),
                              "packages"),
    "LogConfig(level='LOUD')": (lambda: sky.LogConfig(level="LOUD"), "level"),
    "Nodes(1, 2, 3, 4)": (lambda: sky.Nodes(1, 2, 3, 4), "at most 3 positional"),
    "Nodes(2, desired=2)": (lambda: sky.Nodes(2, desired=2), "both positionally and by name"),
    "lock timeout=-1": (lambda: Lock("l", None, None, timeout=-1), "timeout"),  # type: ignore[arg-type]
    "lock timeout=nan": (lambda: Lock("l", None, None, timeout=math.nan), "timeout"),  # type: ignore[arg-type]
    "barrier n=0": (lambda: Barrier("b", None, 0, 10), "n >= 1"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_a_config_error_naming_the_field(name: str) -> None:
    make, named = BAD[name]
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        make()


def test_waits_refuse_negative_timeouts_before_touching_etcd() -> None:
    queue = Queue.__new__(Queue)
    queue.name = "q"
    with pytest.raises(ConfigError, match="get\\(timeout\\)"):
        queue.get(timeout=-1)
    lock = Lock.__new__(Lock)
    lock.name, lock.timeout = "l", 5.0
    with pytest.raises(ConfigError, match="acquire\\(timeout\\)"):
        lock.acquire(timeout=-1)


def test_positional_fields_follow_the_reference() -> None:
    assert sky.Nodes(4) == sky.Nodes(desired=4)
    assert sky.Nodes(2, 8) == sky.Nodes(desired=2, max=8)
    assert sky.Spec(sky.Local()).provider == sky.Local()
    assert sky.Worker(2).concurrency == 2
    assert sky.Volume("my-data", "/data").mount == "/data"


def test_skyward_toml_reports_every_problem_of_a_pool_at_once(tmp_path: Path) -> None:
    (tmp_path / "skyward.toml").write_text(
        '[pools.bad]\nprovider = "local"\nnodes = 0\nttl = -5\nallocation = "sometimes"\n'
        'bogus = 1\n[pools.bad.image]\npython = 3\n'
    )
    with pytest.raises(ConfigError) as raised:
        load_pool("bad", cwd=tmp_path)
    lines = str(raised.value).splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "pools.bad.bogus", "pools.bad.nodes", "pools.bad.allocation", "pools.bad.image.python",
        "pools.bad.ttl",
    ]
    assert all(line.startswith(str(tmp_path / "skyward.toml")) for line in lines)


def test_a_missing_provider_is_reported_with_the_other_problems(tmp_path: Path) -> None:
    (tmp_path / "skyward.toml").write_text('[pools.p]\nnodes = 0\n')
    with pytest.raises(ConfigError) as raised:
        load_pool("p", cwd=tmp_path)
    message = str(raised.value)
    assert "pools.p.provider is missing" in message and "pools.p.nodes" in message
