"""Whether this machine holds cloud credentials, asked before anything is provisioned.

The Pulumi provider plugins read credentials themselves; skyward_iac never stores them. These
checks only look for a source the plugin would also find, so a pool without credentials fails
at once with what to set, instead of minutes later inside ``pulumi up``.
"""

from __future__ import annotations

import os
from pathlib import Path

from skyward_iac.api.errors import ConfigError

#: Where each provider's credentials may come from, as the error message lists them.
AWS_SOURCES = ("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
               "AWS_PROFILE (also after `aws sso login`)", "~/.aws/credentials or ~/.aws/config",
               "an instance role")
GCP_SOURCES = ("GOOGLE_APPLICATION_CREDENTIALS (a service-account key file)",
               "GOOGLE_CREDENTIALS (the key's JSON)", "GOOGLE_OAUTH_ACCESS_TOKEN",
               "`gcloud auth application-default login`", "a GCE metadata server")


def aws_credential_source() -> str | None:
    """How botocore would authenticate (``env``, ``shared-credentials-file``, ``sso``,
    ``iam-role`` ...), None when it finds nothing. The same chain the AWS plugin uses."""
    import boto3  # type: ignore[import-untyped]

    credentials = boto3.Session().get_credentials()
    return None if credentials is None else str(credentials.method)


def gcp_credential_source() -> str | None:
    """Which Application Default Credentials source exists, None when there is none."""
    if key_file := os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return f"GOOGLE_APPLICATION_CREDENTIALS={key_file}" if Path(key_file).is_file() else None
    for variable in ("GOOGLE_CREDENTIALS", "GOOGLE_OAUTH_ACCESS_TOKEN"):
        if os.environ.get(variable):
            return variable
    config = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    if (config / "application_default_credentials.json").is_file():
        return "gcloud application-default credentials"
    try:  # google-auth's own test for running on GCE, without a network round trip
        if "Google" in Path("/sys/class/dmi/id/product_name").read_text():
            return "GCE metadata server"
    except OSError:
        pass
    return None


def require_credentials(provider: str) -> None:
    """Raise ``ConfigError`` naming what to set when ``provider`` ("aws"/"gcp") has no
    credentials on this machine; Local needs none."""
    from skyward_iac.infra.clouds import cloud

    provider_cloud = cloud(provider)
    if provider_cloud.on_this_machine:
        return
    if provider_cloud.credential_source() is None:
        raise ConfigError(
            f"no {provider.upper()} credentials found; set one of: "
            f"{'; '.join(provider_cloud.credential_sources)}. "
            "See docs/providers.md for the permissions the identity needs."
        )
