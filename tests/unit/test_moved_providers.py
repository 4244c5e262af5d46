"""Stacks created before issue 31 moved the dynamic providers hold them pickled by their old
module paths: the provider host aliases those paths, so such a stack can still be updated and
destroyed. Each case is a fresh interpreter, as the engine starts the provider host."""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest

from skyward_iac.infra.engine.provider_host import MOVED_PROVIDERS

#: Pickles a provider as the code before the move did: by reference to its class, which lived
#: at the old path. (The SDK's ``serialize_provider`` pickles ours by reference too -- a 77-byte
#: pickle naming the module -- but dill pickles a class whose ``__module__`` was rewritten by
#: value, so the plain pickler stands in for it here.)
PICKLE_AT_OLD_PATH = """
import base64, importlib, pickle, sys
old, new, name = sys.argv[1:4]
module = importlib.import_module(new)
sys.modules[old] = module
cls = getattr(module, name)
cls.__module__ = old
print(base64.b64encode(pickle.dumps(cls(), protocol=pickle.DEFAULT_PROTOCOL)).decode())
"""

#: Loads it as the engine's provider host does (``dill.loads`` of the base64 ``__provider``).
LOAD = """
import base64, sys
import dill
alias = sys.argv[1] == "alias"
if alias:
    from skyward_iac.infra.engine.provider_host import alias_moved_providers
    alias_moved_providers()
provider = dill.loads(base64.b64decode(sys.stdin.read()))
print(type(provider).__module__, type(provider).__name__)
"""

PROVIDERS = {
    "skyward_iac.infra.local_node": "LocalNodeProvider",
    "skyward_iac.infra.credentials": "CredentialsProvider",
    "skyward_iac.infra.cluster_pki": "ClusterPKIProvider",
}


def python(code: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], input=stdin, check=False,
                          capture_output=True, text=True, timeout=120)


def test_every_moved_provider_is_named() -> None:
    assert set(MOVED_PROVIDERS) == set(PROVIDERS)


@pytest.mark.parametrize("old", sorted(PROVIDERS))
def test_a_provider_pickled_at_its_old_path_loads_once_aliased(old: str) -> None:
    new, name = MOVED_PROVIDERS[old], PROVIDERS[old]
    pickled = python(PICKLE_AT_OLD_PATH, old, new, name)
    assert pickled.returncode == 0, pickled.stderr
    assert old.encode() in base64.b64decode(pickled.stdout)  # by reference, the old path
    assert new.encode() not in base64.b64decode(pickled.stdout)
    plain = python(LOAD, "plain", stdin=pickled.stdout)
    assert plain.returncode != 0 and "ModuleNotFoundError" in plain.stderr  # the need
    aliased = python(LOAD, "alias", stdin=pickled.stdout)
    assert aliased.returncode == 0, aliased.stderr
    assert aliased.stdout.split() == [new, name]


def test_no_provider_moves_without_an_alias() -> None:
    """Every dynamic provider lives where stacks pickled it: a moved one needs its old path in
    MOVED_PROVIDERS (and a case above), or existing stacks can no longer be destroyed."""
    import importlib
    import pkgutil

    from pulumi.dynamic import ResourceProvider

    import skyward_iac

    for info in pkgutil.walk_packages(skyward_iac.__path__, "skyward_iac."):
        if ".infra." in info.name and not info.ispkg:
            importlib.import_module(info.name)
    where = {cls.__module__ for cls in ResourceProvider.__subclasses__()
             if cls.__module__.startswith("skyward_iac.")}
    assert where == {*MOVED_PROVIDERS.values(), "skyward_iac.infra.programs.host_key"}
