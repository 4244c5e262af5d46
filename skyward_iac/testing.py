"""A pytest plugin: real Local pools for the tests of code that uses skyward_iac.

Load it with ``pytest -p skyward_iac.testing`` (installing skyward_iac also registers it as a
``pytest11`` entry point, so it loads by itself unless plugin autoloading is off). A test asks
for ``sky_pool`` and gets a ready ``sky.Pool`` of Local nodes: real sshd, agents and etcd on
this machine, one Pulumi stack. Pools are made once per test session for each configuration
and destroyed when the session ends.

Configuration, the marker winning over the ini file::

    # pytest.ini / [tool.pytest.ini_options]
    sky_pool_nodes = 2              # default 1
    sky_pool_pip = numpy pandas     # the nodes' Image(pip=...)
    sky_pool_console = log          # the pool's console: minimal (default), log, silent, rich

    @pytest.mark.sky_pool(nodes=1, image=sky.Image(pip=["numpy"]), options=sky.Options(...))
    def test_something(sky_pool): ...

``sky_pools.get(nodes=2)`` gives the same pools to fixtures of any scope. When the machine lacks
what ``scripts/setup`` installs (the Pulumi engine, OpenSSH's sshd), tests using a pool are
skipped, with the reason, instead of failing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from skyward_iac.orchestration.pool import Pool

MARKER = "sky_pool"
#: What the marker and ``sky_pools.get`` accept.
SETTINGS = ("nodes", "image", "options")
DEFAULT_CONSOLE = "minimal"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("sky_pool_nodes", "nodes of the sky_pool fixture's Local pool (default 1)",
                  default="1")
    parser.addini("sky_pool_pip", "packages installed on the sky_pool nodes (Image.pip)",
                  type="args", default=[])
    parser.addini("sky_pool_console", "console of the sky_pool pools: minimal (default), log, "
                  "silent or rich", default=DEFAULT_CONSOLE)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(nodes=1, image=None, options=None): the Local pool this test's "
                   "sky_pool fixture gives (skyward_iac.testing)")


def setup_missing() -> str | None:
    """Why no Local pool can be made on this machine (scripts/setup was not run), or None."""
    from skyward_iac.api.errors import EngineNotFoundError
    from skyward_iac.infra.engine import locate as engine
    from skyward_iac.infra.programs.local_node import sshd_binary

    hint = "run scripts/setup from the skyward_iac checkout to install it"
    try:
        engine.find_engine()
    except EngineNotFoundError as exc:
        return f"sky_pool needs the Pulumi engine; {hint}. {exc}"
    try:
        sshd_binary()
    except RuntimeError as exc:
        return f"sky_pool needs OpenSSH's sshd for Local nodes; {hint}. {exc}"
    return None


def pool_settings(marked: Mapping[str, Any], ini: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sky.Compute`` arguments of a pool: the marker's settings over the ini file's.

    ``ini`` holds the raw ini values (``sky_pool_nodes`` etc.); a bad value is a ConfigError
    that names it, raised before anything is provisioned.
    """
    from skyward_iac.api.errors import ConfigError
    from skyward_iac.api.options import Options
    from skyward_iac.api.spec import Image, validated

    unknown = sorted(set(marked) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"@pytest.mark.{MARKER} takes {', '.join(SETTINGS)}; got {unknown}")
    raw_nodes = ini.get("sky_pool_nodes", "1")
    try:
        nodes = int(raw_nodes)
    except (TypeError, ValueError):
        raise ConfigError(f"ini option sky_pool_nodes must be a whole number, "
                          f"got {raw_nodes!r}") from None
    pip = tuple(ini.get("sky_pool_pip") or ())
    settings: dict[str, Any] = {
        "nodes": nodes,
        "image": validated(Image, pip=pip) if pip else None,
        "options": validated(Options, console=ini.get("sky_pool_console") or DEFAULT_CONSOLE),
    }
    settings.update({key: value for key, value in marked.items() if value is not None})
    return {key: value for key, value in settings.items() if value is not None}


class Pools:
    """The session's Local pools, one per configuration, made on first use and destroyed
    together at the end (``close``). A configuration that failed to come up fails again at
    once for the next test, rather than being provisioned again."""

    def __init__(self, ini: Mapping[str, Any]) -> None:
        self.ini = ini
        self._pools: dict[str, Pool | BaseException] = {}
        self._exit = contextlib.ExitStack()

    def get(self, **marked: Any) -> Pool:
        """The pool for these settings (``nodes``, ``image``, ``options``; the ini file fills
        in the rest); skips the test when the machine cannot run Local pools."""
        if reason := setup_missing():
            pytest.skip(reason)
        settings = pool_settings(marked, self.ini)
        key = repr(sorted(settings.items()))
        if key not in self._pools:
            from skyward_iac.api.providers import Local
            from skyward_iac.orchestration.compute import Compute

            try:
                self._pools[key] = self._exit.enter_context(Compute(provider=Local(), **settings))
            except Exception as exc:  # kept: the next test gets the same error at once
                self._pools[key] = exc
                raise
        pool = self._pools[key]
        if isinstance(pool, BaseException):
            raise pool
        return pool

    def close(self) -> None:
        """Destroy every pool of the session."""
        self._exit.close()
        self._pools.clear()


@pytest.fixture(scope="session")
def sky_pools(pytestconfig: pytest.Config) -> Iterator[Pools]:
    """The session's Local pools: ``sky_pools.get(nodes=2)``; destroyed at the session's end."""
    ini = {name: pytestconfig.getini(name)
           for name in ("sky_pool_nodes", "sky_pool_pip", "sky_pool_console")}
    pools = Pools(ini)
    try:
        yield pools
    finally:
        pools.close()


@pytest.fixture
def sky_pool(request: pytest.FixtureRequest, sky_pools: Pools) -> Pool:
    """A ready Local pool, shared by every test with the same configuration (this test's
    ``@pytest.mark.sky_pool(...)``, else the ini file's ``sky_pool_*`` options)."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is not None and marker.args:
        from skyward_iac.api.errors import ConfigError

        raise ConfigError(f"@pytest.mark.{MARKER} takes keyword arguments only "
                          f"({', '.join(SETTINGS)}), got {marker.args!r}")
    return sky_pools.get(**(marker.kwargs if marker is not None else {}))
