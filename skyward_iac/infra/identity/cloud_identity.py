"""Which AWS account and GCP project this machine's credentials act in, asked once per stack.

``ClusterStack.create`` stores the answers in the new stack (``programs/pins.py``); nothing
asks again for that stack, whatever the shell that later updates or destroys it defaults to.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from pathlib import Path

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.programs.common import caller_cidr
from skyward_iac.infra.programs.pins import Resolvers

#: Where the GCP provider looks for a default project, in its order of precedence.
GCP_PROJECT_VARIABLES = ("GOOGLE_PROJECT", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT",
                         "CLOUDSDK_CORE_PROJECT")


def aws_account_id(region: str) -> str:
    """The account of this machine's AWS credentials (STS ``GetCallerIdentity`` in ``region``)."""
    import boto3  # type: ignore[import-untyped]
    from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

    try:
        identity = boto3.client("sts", region_name=region).get_caller_identity()
    except (BotoCoreError, ClientError) as exc:
        raise ConfigError(f"could not learn the AWS account of this machine's credentials "
                          f"({exc}); the stack pins it when it is created") from None
    return str(identity["Account"])


def gcp_default_project(environ: Mapping[str, str] | None = None) -> str | None:
    """The project the GCP provider would default to: the first of ``GCP_PROJECT_VARIABLES``
    that is set, else ``core/project`` of the active gcloud configuration; None without one."""
    environ = os.environ if environ is None else environ
    for variable in GCP_PROJECT_VARIABLES:
        if environ.get(variable):
            return environ[variable]
    root = Path(environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    name = environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    if not name:
        try:
            name = (root / "active_config").read_text().strip() or "default"
        except OSError:
            name = "default"
    parser = configparser.ConfigParser()
    try:
        parser.read(root / "configurations" / f"config_{name}")
    except configparser.Error:
        return None
    return parser.get("core", "project", fallback=None) or None


#: What ``ClusterStack.create`` asks: the real network, STS and gcloud configuration.
RESOLVERS = Resolvers(caller_cidr=caller_cidr, aws_account_id=aws_account_id,
                      gcp_project=gcp_default_project)
