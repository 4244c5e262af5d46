"""Finding the Pulumi engine and the environment every Pulumi command runs with.

skyward_iac never downloads the engine: ``scripts/setup`` (tools/pulumi/build.sh) builds it from
Go modules into ``~/.skyward/pulumi/<version>/bin`` (the newest such build is used), with a guard compiled into its gRPC package
that refuses every call from another local user (``GUARD_STAMP`` beside the binary says so).
``$SKYWARD_PULUMI_ROOT`` names another such build (``<root>/bin/pulumi``); a ``pulumi`` on PATH
is used only when it has the stamp too: a stock engine serves any local user on 127.0.0.1.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from skyward_iac.api.errors import EngineNotFoundError
from skyward_iac.infra.stacks import home

LAUNCHER = "pulumi-resource-pulumi-python"
#: The line that marks the current launcher (tools/pulumi/pulumi-resource-pulumi-python): it
#: runs providers through ``infra.engine.provider_host``; an older one would run them unguarded.
LAUNCHER_MARK = "skyward-launcher: 2"
#: Written beside the binary by tools/pulumi/build.sh when the engine is built with its gRPC
#: servers guarded (tools/pulumi/same_user_grpc.go.overlay).
GUARD_STAMP = "pulumi.guard"


def sdk_version() -> str:
    """The pinned Pulumi Python SDK version; the engine must be at least this version."""
    return importlib.metadata.version("pulumi")


@dataclass(frozen=True, slots=True)
class Engine:
    """A usable Pulumi CLI: its root (``root/bin/pulumi``), version and the launcher directory."""

    root: Path
    version: str
    launcher_dir: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "pulumi"


def _version_of(binary: Path) -> str | None:
    """``binary``'s version: as an earlier process read it while the file is the same one
    (inode, size, modification and change times), else by running ``pulumi version`` (0.2-0.4
    CPU-s, in every process that uses the engine: each CLI command, each pool script)."""
    try:
        stat = binary.stat()
    except OSError:
        return None
    identity = [stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
    known = _known_versions()
    entry = known.get(str(binary))
    if isinstance(entry, dict) and entry.get("file") == identity and entry.get("version"):
        return str(entry["version"])
    version = _run_version(binary)
    if version:
        _remember_versions({**known, str(binary): {"file": identity, "version": version}})
    return version


def _versions_file() -> Path:
    return home.skyward_home() / "cache" / "engine-versions.json"


def _known_versions() -> dict[str, object]:
    try:
        known = json.loads(_versions_file().read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _remember_versions(known: dict[str, object]) -> None:
    """Write the versions file whole (a rename: a concurrent reader sees the old or the new;
    a concurrent writer's entry may be lost, and is read from its binary again)."""
    target = _versions_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        scratch.write_text(json.dumps(known, sort_keys=True))
        os.replace(scratch, target)
    except OSError:
        pass  # a cache: the next process asks the binary again


def _run_version(binary: Path) -> str | None:
    # No timeout: `pulumi version` reads no network here (PULUMI_SKIP_UPDATE_CHECK) and ends at
    # once, and a timed wait polls with sleeps, which a clock shim can break (libfaketime with
    # a real monotonic clock fails Python's absolute-deadline sleep with EINVAL).
    try:
        out = subprocess.run(
            [str(binary), "version"], capture_output=True, text=True, check=False,
            env={**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"},
        )
    except OSError:
        return None
    return out.stdout.strip().removeprefix("v") or None


def _version_parts(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("-")[0].split(".") if p.isdigit())


def _at_least(found: str, wanted: str) -> bool:
    return _version_parts(found) >= _version_parts(wanted)


def _builds(root: Path) -> list[Path]:
    """The engines tools/pulumi/build.sh built under ``root`` (``v<version>/bin/pulumi``),
    newest version first: the engine is pinned in tools/pulumi/go.mod, not to the SDK."""
    found = [path for path in root.glob("v*/bin/pulumi") if path.is_file()]
    return sorted(found, key=lambda path: _version_parts(path.parent.parent.name[1:]),
                  reverse=True)


@functools.cache
def find_engine() -> Engine:
    """Locate the engine, or raise ``EngineNotFoundError`` saying exactly how to install it."""
    wanted = sdk_version()
    candidates: list[Path] = []
    if explicit := os.environ.get("SKYWARD_PULUMI_ROOT"):
        candidates.append(Path(explicit) / "bin" / "pulumi")
    builds = _builds(home.skyward_home() / "pulumi")
    candidates.extend(builds)
    cache = builds[0].parent if builds else home.skyward_home() / "pulumi" / f"v{wanted}" / "bin"
    if not builds:
        candidates.append(cache / "pulumi")  # named in the error when nothing is built
    if on_path := shutil.which("pulumi"):
        candidates.append(Path(on_path))
    tried = []
    for binary in candidates:
        version = _version_of(binary) if binary.is_file() else None
        guarded = (binary.parent / GUARD_STAMP).is_file()
        tried.append(f"{binary} ({version or 'missing'}"
                     f"{'' if guarded or not version else ', not built with the same-user guard'})")
        if version and guarded and _at_least(version, wanted):
            launcher_dir = binary.parent if (binary.parent / LAUNCHER).is_file() else cache
            launcher = launcher_dir / LAUNCHER
            if not launcher.is_file():
                raise EngineNotFoundError(
                    f"found pulumi {version} at {binary} but not the dynamic-provider launcher "
                    f"{LAUNCHER}; run scripts/setup (or tools/pulumi/build.sh) to install it"
                )
            if LAUNCHER_MARK not in launcher.read_text(errors="replace"):
                raise EngineNotFoundError(
                    f"the dynamic-provider launcher {launcher} is an older one (it would run "
                    "providers without their guards); run scripts/setup (or "
                    "tools/pulumi/build.sh) to install the current one"
                )
            return Engine(binary.parent.parent, version, launcher_dir)
    raise EngineNotFoundError(
        f"no Pulumi engine >= {wanted} built with skyward_iac's same-user guard found "
        f"(tried: {', '.join(tried)}).\n"
        "Install it with `scripts/setup` from the skyward_iac checkout, or build just the engine "
        "with `bash tools/pulumi/build.sh` (needs Go >= 1.26.6 and the Go module proxy), or set "
        "SKYWARD_PULUMI_ROOT to a directory whose bin/ holds pulumi of that version."
    )


def engine_env(engine: Engine) -> dict[str, str]:
    """Environment for every Pulumi command: the backend, secrets, no network side trips."""
    path = os.environ.get("PATH", "")
    return {
        "PULUMI_BACKEND_URL": home.backend_url(),
        "PULUMI_CONFIG_PASSPHRASE": home.passphrase(),
        "PULUMI_HOME": str(home.skyward_home() / "pulumi-home"),
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK": "false",
        # The dynamic-provider launcher runs the provider with the client's own interpreter.
        "PULUMI_PYTHON_CMD": sys.executable,
        "PATH": os.pathsep.join([str(engine.launcher_dir), str(engine.binary.parent), path]),
    }
