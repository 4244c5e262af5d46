"""Which AWS account and GCP project this machine's credentials act in, asked once per stack,
and who they are (the audit's actor).

``ClusterStack.create`` stores the answers in the new stack (``programs/pins.py``); nothing
asks again for that stack, whatever the shell that later updates or destroys it defaults to.
The same STS answer names the caller (its ARN): ``actor`` gives it to the stack's tags and to
every update message this process writes, without asking again.
"""

from __future__ import annotations

import configparser
import getpass
import json
import os
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.programs.common import caller_cidr
from skyward_iac.infra.programs.pins import Resolvers

if TYPE_CHECKING:
    from skyward_iac.infra.clouds import Cloud

#: Where the GCP provider looks for a default project, in its order of precedence.
GCP_PROJECT_VARIABLES = ("GOOGLE_PROJECT", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT",
                         "CLOUDSDK_CORE_PROJECT")


#: How an actor was learned (``tags.ACTOR_SOURCE`` values).
AWS_STS, GCP_SERVICE_ACCOUNT, GCLOUD_ACCOUNT = "aws-sts", "gcp-service-account", "gcloud-account"
SELF_DECLARED = "self-declared"
#: The actor per provider this process learned (``actor``): asked once, remembered.
_actors: dict[str, tuple[str, str]] = {}
_actors_lock = threading.Lock()


def aws_account_id(region: str) -> str:
    """The account of this machine's AWS credentials (STS ``GetCallerIdentity`` in ``region``);
    the caller's ARN is remembered as this process's AWS actor."""
    import boto3  # type: ignore[import-untyped]
    from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

    try:
        identity = boto3.client("sts", region_name=region).get_caller_identity()
    except (BotoCoreError, ClientError) as exc:
        raise ConfigError(f"could not learn the AWS account of this machine's credentials "
                          f"({exc}); the stack pins it when it is created") from None
    with _actors_lock:
        _actors["aws"] = (str(identity["Arn"]), AWS_STS)
    return str(identity["Account"])


def self_declared() -> tuple[str, str]:
    """``user@host`` from the environment and the host name: anyone can set them."""
    return f"{getpass.getuser()}@{socket.gethostname()}", SELF_DECLARED


def gcp_account(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The identity the GCP provider authenticates as, from its credentials: a service
    account key's ``client_email`` (``GOOGLE_APPLICATION_CREDENTIALS``), else the active
    gcloud configuration's ``core/account``; None without either."""
    environ = os.environ if environ is None else environ
    if key_file := environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        try:
            email = json.loads(Path(key_file).read_text()).get("client_email")
        except (OSError, ValueError, AttributeError):
            email = None
        if email:
            return str(email), GCP_SERVICE_ACCOUNT
    account = _gcloud_setting("account", environ)
    return (account, GCLOUD_ACCOUNT) if account else None


def aws_caller() -> tuple[str, str] | None:
    """The AWS caller ARN (STS, asked at most once per process: ``aws_account_id`` answers it
    on the way); None without credentials here (the engine will say so)."""
    try:
        aws_account_id(os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                       or "us-east-1")
    except ConfigError:
        return None
    with _actors_lock:
        return _actors.get("aws")


def actor(provider: str) -> tuple[str, str]:
    """Who this process acts as on ``provider``, and how that is known: what the provider's
    credentials authenticate (``Cloud.find_actor``: the AWS caller ARN, the GCP account),
    remembered once learned, else ``self_declared``."""
    with _actors_lock:
        known = _actors.get(provider)
    if known is not None:
        return known
    found = _cloud(provider).find_actor()
    with _actors_lock:  # not found: self-declared from now on, rather than ask at every call
        return _actors.setdefault(provider, _actors.get(provider) or found or self_declared())


def known_actor(provider: str) -> tuple[str, str]:
    """What ``actor`` gives without asking the network: where the answer costs a call
    (``Cloud.actor_costs_a_call``: AWS's STS), only what this process learned already
    (creating the stack asked STS), else ``self_declared``."""
    if _cloud(provider).actor_costs_a_call:
        with _actors_lock:
            return _actors.get(provider) or self_declared()
    return actor(provider)


def _cloud(provider: str) -> Cloud:
    """``provider``'s object (clouds/ imports this module: asked when first needed); an unknown
    kind answers as Local does (self-declared)."""
    from skyward_iac.infra.clouds import CLOUDS, LOCAL

    return CLOUDS.get(provider, LOCAL)


def gcp_default_project(environ: Mapping[str, str] | None = None) -> str | None:
    """The project the GCP provider would default to: the first of ``GCP_PROJECT_VARIABLES``
    that is set, else ``core/project`` of the active gcloud configuration; None without one."""
    environ = os.environ if environ is None else environ
    for variable in GCP_PROJECT_VARIABLES:
        if environ.get(variable):
            return environ[variable]
    return _gcloud_setting("project", environ)


def _gcloud_setting(setting: str, environ: Mapping[str, str]) -> str | None:
    """``core/<setting>`` of the active gcloud configuration, None when unset."""
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
    return parser.get("core", setting, fallback=None) or None


#: What ``ClusterStack.create`` asks: the real network, STS and gcloud configuration.
RESOLVERS = Resolvers(caller_cidr=caller_cidr, aws_account_id=aws_account_id,
                      gcp_project=gcp_default_project)
