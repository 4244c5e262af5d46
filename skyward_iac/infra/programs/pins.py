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
#: The keys each provider pins (also settings of the ``stacks/`` projects, same meaning).
PIN_KEYS: dict[str, tuple[str, ...]] = {
    "local": (), "aws": (SSH_CIDR, AWS_ACCOUNT_ID, *DECIDED),
    "gcp": (SSH_CIDR, GCP_PROJECT, *DECIDED, IDENTITY)}


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
    """The config a new stack for ``request`` stores: each pin resolved exactly once.

    Explicit settings win (``ssh_cidr``, ``sky.GCP(project=...)``) and are not looked up.
    Raises ``ConfigError`` when a value cannot be learned.
    """
    provider = request.spec.provider
    if provider.kind not in ("aws", "gcp"):
        return {}
    pins = {SSH_CIDR: common.resolve_ssh_cidr(getattr(provider, "ssh_cidr", None),
                                              resolvers.caller_cidr)}
    if provider.kind == "aws":
        region = (request.offer or select([request.spec]).offer).region
        pins[AWS_ACCOUNT_ID] = resolvers.aws_account_id(region)
        return pins
    project = getattr(provider, "project", None) or resolvers.gcp_project()
    if not project:
        raise ConfigError("no GCP project: set sky.GCP(project=...), GOOGLE_PROJECT or "
                          "`gcloud config set project ...`")
    pins[GCP_PROJECT] = project
    return pins


def config_values(pins: Mapping[str, str]) -> dict[str, str]:
    """``pins`` as namespaced stack config keys (``skyward:sshCidr`` ...)."""
    return {f"{NAMESPACE}:{key}": value for key, value in pins.items()}


def read_pins(provider: str) -> dict[str, str]:
    """The pins stored in the running stack's config; none for a stack created before them.

    Inside a Pulumi program only.
    """
    from pulumi.runtime.config import CONFIG  # the SDK's own map; pulumi.Config cannot list

    config = CONFIG.get()
    return {key: str(config[f"{NAMESPACE}:{key}"]) for key in PIN_KEYS.get(provider, ())
            if config.get(f"{NAMESPACE}:{key}")}


def pinned_ssh_cidr(pins: Mapping[str, str], configured: str | None,
                    lookup: Callable[[], str] | None) -> str:
    """The stored SSH CIDR; looked up now only for a stack that has none stored."""
    return common.resolve_ssh_cidr(pins.get(SSH_CIDR) or configured, lookup)
