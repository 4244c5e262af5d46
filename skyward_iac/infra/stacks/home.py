"""The skyward home directory (``~/.skyward`` or ``$SKYWARD_HOME``) and its layout."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def skyward_home() -> Path:
    """Root of everything skyward_iac keeps on this machine; created 0700 on first use."""
    home = Path(os.environ.get("SKYWARD_HOME") or Path.home() / ".skyward").expanduser().resolve()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def state_dir() -> Path:
    """The Pulumi file backend: every stack and its update history."""
    return _subdir("state")


def backend_url() -> str:
    """Where stacks live: ``$SKYWARD_BACKEND_URL``, else ``[state] backend`` in skyward.toml,
    else the file backend in this home. Any Pulumi backend URL works (``s3://``, ``gs://``,
    ``azblob://``, ``file://``, Pulumi Cloud)."""
    if from_env := os.environ.get("SKYWARD_BACKEND_URL"):
        return from_env  # before reading skyward.toml: its module costs a second to import
    from skyward_iac import config_file

    return config_file.state_setting("backend") or f"file://{state_dir()}"


def file_backend() -> Path | None:
    """The directory of the backend when it is a file backend (read directly for fast
    listings and repairs), else None."""
    url = backend_url()
    return Path(url.removeprefix("file://")) if url.startswith("file://") else None


def secrets_provider() -> str | None:
    """How stack secrets are encrypted: ``$SKYWARD_SECRETS_PROVIDER``, else ``[state]
    secrets_provider``, else None (the passphrase). Any Pulumi provider URL works
    (``awskms://``, ``gcpkms://``, ``azurekeyvault://``, ``hashivault://``)."""
    from skyward_iac import config_file

    value = (os.environ.get("SKYWARD_SECRETS_PROVIDER")
             or config_file.state_setting("secrets_provider"))
    return None if value in (None, "passphrase", "default") else value


def workspace_dir() -> Path:
    """The persistent Pulumi project work dir (stack settings and secret salts live here)."""
    return _subdir("workspace")


def local_nodes_dir() -> Path:
    """Sandboxes of Local provider nodes."""
    return _subdir("local")


def _subdir(name: str) -> Path:
    path = skyward_home() / name
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def passphrase() -> str:
    """The secrets passphrase: ``$PULUMI_CONFIG_PASSPHRASE``, else a generated one kept 0600."""
    if from_env := os.environ.get("PULUMI_CONFIG_PASSPHRASE"):
        return from_env
    path = skyward_home() / "passphrase"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    value = secrets.token_urlsafe(32)
    # O_EXCL: two first runs at once must not write two different passphrases.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as file:
        file.write(value + "\n")
    return value
