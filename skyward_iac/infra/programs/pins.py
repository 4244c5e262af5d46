"""What a cloud stack pins: the SSH CIDR, the AWS account, the GCP project, and what its nodes
were created with.

The first three are resolved once, by the machine that creates the stack (``stack_pins``), and
stored in the stack's config as ``skyward:<key>``; every later program run reads them back
(``read_pins``) instead of asking again, so an update from another network, or from a shell
whose default account or project differs, declares the same inputs. The explicit provider
resource carries the account or project into the state, where ``refresh``, ``destroy`` and
``gc`` use it without running the program. The others (``DECIDED``) are decided by the stack's
first successful run and stored after it (``decisions.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.capacity.offers import select
from skyward_iac.infra.programs import ClusterRequest, common

NAMESPACE = "skyward"
SSH_CIDR = "sshCidr"
AWS_ACCOUNT_ID = "awsAccountId"
GCP_PROJECT = "project"
#: Decided by a stack's first run (decisions.py): provider, region and instance type; the zone
#: and image of new nodes; each node's image (and GCP zone); the resource tags, lifetime cap and
#: pool maximum of the request that created the stack.
PLACE, ZONE, IMAGE, NODES = "place", "zone", "image", "nodes"
TAGS, MAX_LIFETIME, MAX_NODES = "tags", "maxLifetime", "maxNodes"
DECIDED = (PLACE, ZONE, IMAGE, NODES, TAGS, MAX_LIFETIME, MAX_NODES)
#: GCP: what the nodes go without since GCP refused part of their identity (gcp_identity.py).
IDENTITY = "identity"
# The keys each provider pins (also settings of the ``stacks/`` projects, same meaning) are
# its ``Cloud.pin_keys`` (infra/clouds/).


@dataclass(frozen=True, slots=True)
class Resolvers:
    """How the creating machine learns what it pins; each may ask a network or the cloud."""

    #: The caller's public address as a CIDR (``common.caller_cidr``).
    caller_cidr: Callable[[], str]
    #: The account this machine's AWS credentials act in, asked in a region.
    aws_account_id: Callable[[str], str]
    #: The GCP project the provider would default to; None when there is none.
    gcp_project: Callable[[], str | None]


def stack_pins(request: ClusterRequest, resolvers: Resolvers) -> dict[str, str]:
    """The config a new stack for ``request`` stores: each pin resolved exactly once, as its
    provider pins (``Cloud.stack_pins``: ``aws_pins``, ``gcp_pins``; Local pins nothing).

    Explicit settings win (``ssh_cidr``, ``sky.GCP(project=...)``) and are not looked up.
    Raises ``ConfigError`` when a value cannot be learned.
    """
    from skyward_iac.infra.clouds import cloud

    return cloud(request.spec.provider.kind).stack_pins(request, resolvers)


def aws_pins(request: ClusterRequest, resolvers: Resolvers) -> dict[str, str]:
    """An AWS stack's pins: the SSH CIDR and the account this machine's credentials act in."""
    region = (request.offer or select([request.spec]).offer).region
    return {**_ssh_pin(request, resolvers), AWS_ACCOUNT_ID: resolvers.aws_account_id(region)}


def gcp_pins(request: ClusterRequest, resolvers: Resolvers) -> dict[str, str]:
    """A GCP stack's pins: the SSH CIDR and the project (``sky.GCP(project=...)`` or the
    provider's default)."""
    project = getattr(request.spec.provider, "project", None) or resolvers.gcp_project()
    if not project:
        raise ConfigError("no GCP project: set sky.GCP(project=...), GOOGLE_PROJECT or "
                          "`gcloud config set project ...`")
    return {**_ssh_pin(request, resolvers), GCP_PROJECT: project}


def _ssh_pin(request: ClusterRequest, resolvers: Resolvers) -> dict[str, str]:
    return {SSH_CIDR: common.resolve_ssh_cidr(getattr(request.spec.provider, "ssh_cidr", None),
                                              resolvers.caller_cidr)}


def config_values(pins: Mapping[str, str]) -> dict[str, str]:
    """``pins`` as namespaced stack config keys (``skyward:sshCidr`` ...)."""
    return {f"{NAMESPACE}:{key}": value for key, value in pins.items()}


def read_pins(provider: str) -> dict[str, str]:
    """The pins stored in the running stack's config; none for a stack created before them.

    Inside a Pulumi program only.
    """
    from pulumi.runtime.config import CONFIG  # the SDK's own map; pulumi.Config cannot list

    from skyward_iac.infra.clouds import cloud

    config = CONFIG.get()
    return {key: str(config[f"{NAMESPACE}:{key}"]) for key in cloud(provider).pin_keys
            if config.get(f"{NAMESPACE}:{key}")}


def pinned_ssh_cidr(pins: Mapping[str, str], configured: str | None,
                    lookup: Callable[[], str] | None) -> str:
    """The stored SSH CIDR; looked up now only for a stack that has none stored."""
    return common.resolve_ssh_cidr(pins.get(SSH_CIDR) or configured, lookup)
