"""Engine discovery: the pinned version, and an actionable error when it is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skyward_iac.api.errors import EngineNotFoundError
from skyward_iac.infra.engine import locate as engine
from skyward_iac.infra.stacks import home


def test_found_engine_is_the_pinned_build_and_not_older_than_the_sdk() -> None:
    found = engine.find_engine()
    go_mod = (Path(__file__).parents[2] / "tools" / "pulumi" / "go.mod").read_text().split()
    pinned = go_mod[go_mod.index("github.com/pulumi/pulumi/pkg/v3") + 1]
    assert found.version == pinned.removeprefix("v")
    assert engine._at_least(found.version, engine.sdk_version())
    assert (found.launcher_dir / engine.LAUNCHER).is_file()
    assert (found.binary.parent / engine.GUARD_STAMP).is_file()


def test_an_engine_built_without_the_same_user_guard_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real binary of the right version, but not stamped as built with the guard: a
    # stock engine, whose gRPC servers answer every local user.
    stock = tmp_path / "stock" / "bin"
    stock.mkdir(parents=True)
    real = engine.find_engine()
    (stock / "pulumi").symlink_to(real.binary)
    (stock / engine.LAUNCHER).write_text((real.launcher_dir / engine.LAUNCHER).read_text())
    monkeypatch.setenv("SKYWARD_PULUMI_ROOT", str(stock.parent))
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", f"{stock}:/usr/bin:/bin")
    engine.find_engine.cache_clear()
    try:
        with pytest.raises(EngineNotFoundError, match="not built with the same-user guard"):
            engine.find_engine()
        (stock / engine.GUARD_STAMP).write_text("stamp\n")
        engine.find_engine.cache_clear()
        assert engine.find_engine().binary == stock / "pulumi"
    finally:
        engine.find_engine.cache_clear()


def test_missing_engine_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_PULUMI_ROOT", str(tmp_path / "nowhere"))
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    engine.find_engine.cache_clear()
    try:
        with pytest.raises(EngineNotFoundError) as caught:
            engine.find_engine()
    finally:
        engine.find_engine.cache_clear()
    message = str(caught.value)
    assert engine.sdk_version() in message
    assert "scripts/setup" in message and "tools/pulumi/build.sh" in message


def test_generated_passphrase_is_private_and_stable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    first = home.passphrase()
    assert home.passphrase() == first and len(first) >= 32
    assert oct((tmp_path / "passphrase").stat().st_mode & 0o777) == "0o600"
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "from-env")
    assert home.passphrase() == "from-env"


def test_engine_env_never_downloads_and_uses_the_file_backend() -> None:
    env = engine.engine_env(engine.find_engine())
    assert env["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] == "true"
    assert env["PULUMI_BACKEND_URL"] == f"file://{home.state_dir()}"
    assert env["PATH"].split(os.pathsep)[0] == str(engine.find_engine().launcher_dir)


def test_a_binarys_version_is_read_once_while_the_file_is_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pulumi version` ran in every process that used the engine (0.2-0.4 CPU-s each): the
    version is kept beside the home's caches and read again only when the file changed."""
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    runs = tmp_path / "runs"
    binary = tmp_path / "bin" / "pulumi"
    binary.parent.mkdir()
    binary.write_text(f"#!/bin/sh\necho run >> {runs}\necho v3.999.0\n")
    binary.chmod(0o755)

    def ran() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    assert engine._version_of(binary) == "3.999.0" and ran() == 1
    assert engine._version_of(binary) == "3.999.0" and ran() == 1  # from the cache
    binary.write_text(f"#!/bin/sh\necho run >> {runs}\necho v3.1000.1\n")  # a new build
    assert engine._version_of(binary) == "3.1000.1" and ran() == 2
    (tmp_path / "home" / "cache" / "engine-versions.json").write_text("{not json")
    assert engine._version_of(binary) == "3.1000.1" and ran() == 3  # unreadable: asked again
    assert engine._version_of(tmp_path / "bin" / "missing") is None
