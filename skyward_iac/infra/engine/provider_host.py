"""Runs Pulumi's Python dynamic provider for our stacks, guarded.

The SDK's provider (``python -m pulumi.dynamic``) serves gRPC without authentication on
127.0.0.1 and unpickles the ``__provider`` field of what it is sent: while one runs, any local
user could make it run code as the pool's owner, and a provider orphaned by an interrupted
engine would stay open to that forever. The engine starts this module instead (through the
``pulumi-resource-pulumi-python`` launcher that ``tools/pulumi/build.sh`` installs), which
runs the SDK's provider with two guards:

* every call's peer must be a process of this user (``same_user.py``): anyone else gets
  PERMISSION_DENIED before anything of the request is unpickled;
* the provider exits as soon as its engine (the parent process) is gone.

``reap_orphans()`` stops provider processes of this user that outlived their engine (from
before these guards, or after a crash); ``skyward-iac gc`` and every new pool call it.
The launcher execs ``python -u -m skyward_iac.infra.provider_host``, a stable name kept at
infra/provider_host.py (installed launchers name it) that runs ``main`` here.

Stacks store their dynamic providers pickled by module path, so the modules that held them before
issue 31 moved them are aliased (``MOVED_PROVIDERS``) before anything is unpickled: a stack
created before the move is still updated and destroyed.
"""

from __future__ import annotations

import importlib
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from skyward_iac.same_user import guarded_server

#: How often the provider checks that its engine still runs.
PARENT_CHECK = 0.5
#: Command-line markers of a dynamic-provider process (ours, as the launcher names it, and the
#: SDK's own).
PROVIDER_MARKERS = (b"skyward_iac.infra.provider_host", b"pulumi.dynamic")


#: Where a pickled provider's class lived before issue 31 -> where it lives now.
MOVED_PROVIDERS = {
    "skyward_iac.infra.local_node": "skyward_iac.infra.programs.local_node",
    "skyward_iac.infra.credentials": "skyward_iac.infra.identity.credentials",
    "skyward_iac.infra.cluster_pki": "skyward_iac.infra.identity.cluster_pki",
}


def alias_moved_providers() -> None:
    """Make the old module paths of moved providers importable, for stacks pickled before."""
    for old, new in MOVED_PROVIDERS.items():
        sys.modules.setdefault(old, importlib.import_module(new))


def exit_with_parent(interval: float = PARENT_CHECK) -> None:
    """End this process when its parent (the engine) is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(0)

    threading.Thread(target=watch, name="skyward-provider-parent", daemon=True).start()


def reap_orphans() -> list[int]:
    """Stop this user's provider processes whose engine is gone (parented to init or a
    subreaper that is not a Pulumi engine); returns their pids."""
    reaped = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != os.getuid():
                continue
            cmdline = (proc / "cmdline").read_bytes()
            if not any(marker in cmdline for marker in PROVIDER_MARKERS):
                continue
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent != 1 and b"pulumi" in Path(f"/proc/{parent}/cmdline").read_bytes():
                continue  # its engine still runs it
            os.kill(int(proc.name), signal.SIGKILL)
            reaped.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return reaped


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the SDK's dynamic provider, guarded; ``argv`` (default: ours) is the engine's."""
    if argv is not None:
        sys.argv[1:] = list(argv)
    exit_with_parent()
    # The SDK's provider builds its server with grpc.server; this process exists to run it,
    # so its server is built with the guard.
    grpc.server = guarded_server
    alias_moved_providers()
    runpy.run_module("pulumi.dynamic", run_name="__main__")


if __name__ == "__main__":
    sys.exit(main())
