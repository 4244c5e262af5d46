"""What a GCP stack's nodes run as: a service account, exactly what it may do, or nothing.

A node needs a cloud identity for two things only. The watchdog's fire path deletes the node's
own instance (``cloud_init.gce_self_delete``: one ``DELETE .../zones/Z/instances/NAME``), since
a VM that powers itself off is only stopped and its disk stays billed; and bucket volumes are
mounted by gcsfuse as the node's service account. So a stack with a ``ttl`` or bucket volumes
gets a service account of its own (never the project's default one, which usually holds
Editor), and that account holds:

* a custom role of the stack's own with one permission, ``compute.instances.delete`` (what the
  fire path calls needs nothing else: it reads its name, zone and token from the metadata
  server), bound on each node's own instance: a node can delete itself and touch nothing else;
* ``roles/storage.objectViewer`` / ``objectUser`` on each volume's bucket.

``sky.GCP(service_account=...)`` chooses: ``"auto"`` (the default: the stack's own account when
the nodes need one), an existing account's email (granted the same, created by nobody), or
None (no account: a silent node powers off and stays stopped until ``gc`` or the pool's
teardown deletes it; no bucket volumes).

Many organizations forbid creating service accounts (the org policy
``iam.disableServiceAccountCreation``), and an identity may lack ``iam.roles.create`` or
``compute.instances.setIamPolicy``. No preflight can ask (reading org policies needs a role
of its own), so a refusal is recognised from the provider's error on that resource
(``identity_fallback``, pure) and the stack stores what it goes without (``skyward:identity``,
``FALLBACKS``); the next run declares that, with a warning that says what the nodes lose.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_gcp as gcp

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.volumes import Volume
from skyward_iac.infra.programs import common, pins
from skyward_iac.infra.programs.common import ClusterPlan
from skyward_iac.infra.programs.decisions import Fallback

AUTO = "auto"
#: The one permission the fire path uses (Compute ``instances.delete`` requires it on the
#: instance; the boot disk goes with it, ``auto_delete``).
SELF_DELETE_PERMISSIONS = ("compute.instances.delete",)
COMPUTE_SCOPE = "https://www.googleapis.com/auth/compute"
STORAGE_READ_ONLY = "https://www.googleapis.com/auth/devstorage.read_only"
STORAGE_READ_WRITE = "https://www.googleapis.com/auth/devstorage.read_write"
#: The roles gcsfuse needs, as Google documents them: viewer to read, user to also write.
OBJECT_VIEWER, OBJECT_USER = "roles/storage.objectViewer", "roles/storage.objectUser"
#: Logical names of the identity's resources (the account's predates the fire path; renaming
#: it would replace the account of every running stack).
ACCOUNT, ROLE, BINDING = "volumes-sa", "self-delete-role", "self-delete"

#: What a stack stores (``skyward:identity``) once GCP refused part of its identity:
#: ``none``, no service account at all; ``account``, the account without the self-delete
#: grant (nodes already created with the account keep it: changing it would stop them).
Without = Literal["none", "account"]
FALLBACKS: tuple[Without, ...] = ("none", "account")
#: The provider's words when the project refuses to create the account: the org policy
#: (its PreconditionFailure names the constraint; its message as Google's docs quote it), the
#: permission, or the IAM API turned off.
ACCOUNT_REFUSED = ("disableServiceAccountCreation", "Service account creation is not allowed",
                   "iam.serviceAccounts.create", "iam.googleapis.com")
#: ... when it refuses the custom role or a binding on an instance: a 403 (``Permission
#: 'iam.roles.create' denied``; ``Required 'compute.instances.setIamPolicy' permission``).
GRANT_REFUSED = ("Error 403", "PERMISSION_DENIED", "iam.roles.", "setIamPolicy",
                 "getIamPolicy", "iam.googleapis.com")


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What one stack's nodes run as."""

    #: ``own``: an account the stack creates; ``given``: ``email``; ``none``: no account.
    account: Literal["own", "given", "none"]
    email: str | None = None
    #: The custom role and one binding per node (the ttl's fire path may delete the node).
    self_delete: bool = False
    #: Bucket -> role for the volumes' buckets.
    buckets: Mapping[str, str] | None = None


def node_identity(plan: ClusterPlan, setting: str | None,
                  fallback: str | None = None) -> NodeIdentity:
    """The identity ``plan``'s nodes get under ``setting`` and the stack's stored ``fallback``.
    ``ConfigError`` when bucket volumes would have no account to mount them as."""
    if fallback is not None and fallback not in FALLBACKS:
        raise ConfigError(f"skyward:identity must be one of {', '.join(FALLBACKS)}, got "
                          f"{fallback!r}")
    volumes = plan.identity_volumes
    if plan.ttl <= 0 and not volumes:
        return NodeIdentity("none")
    if setting is None or (setting == AUTO and fallback == "none"):
        if volumes:
            why = ("sky.GCP(service_account=None)" if setting is None
                   else "GCP refused to create the stack's service account")
            raise ConfigError(f"bucket volumes on GCP are mounted as the nodes' service "
                              f"account, and {why}: give an existing one with "
                              "sky.GCP(service_account='NAME@PROJECT.iam.gserviceaccount.com')")
        return NodeIdentity("none")
    kind: Literal["own", "given"] = "own" if setting == AUTO else "given"
    return NodeIdentity(kind, None if kind == "own" else setting,
                        self_delete=plan.ttl > 0 and fallback != "account",
                        buckets=bucket_roles(volumes))


def identity_fallback(identity: NodeIdentity, errors: Mapping[str, str]
                      ) -> tuple[Without, str] | None:
    """What to go without after a failed update, and why: ``errors`` maps logical resource
    names to their error text. ``none`` when GCP refused to create the account (never for a
    pool whose volumes need it), ``account`` when it refused the self-delete role or a binding;
    None when no identity resource was refused (the failure is someone else's)."""
    for name, text in errors.items():
        if name == ACCOUNT and identity.account == "own" and not identity.buckets \
                and _says(text, ACCOUNT_REFUSED):
            return "none", _first_line(text)
    for name, text in errors.items():
        if identity.self_delete and (name == ROLE or name.endswith(f"-{BINDING}")) \
                and _says(text, GRANT_REFUSED):
            return "account", _first_line(text)
    return None


def program_fallback(stack: str, identity: NodeIdentity
                     ) -> Callable[[Mapping[str, str]], Fallback | None]:
    """The GCP program's ``StackProgram.fallback``: ``identity_fallback`` as the decision to
    store (``skyward:identity``) and the warning."""
    def fallback(errors: Mapping[str, str]) -> Fallback | None:
        found = identity_fallback(identity, errors)
        if found is None:
            return None
        value, reason = found
        return Fallback({pins.IDENTITY: value}, fallback_warning(stack, value, reason))

    return fallback


def fallback_warning(stack: str, fallback: Without, reason: str) -> str:
    """The warning a stack gives when it goes without part of its identity."""
    lost = ("no service account" if fallback == "none"
            else "a service account that may not delete its own instance")
    return (f"stack {stack}: GCP refused the nodes' identity ({reason}); the nodes run with "
            f"{lost}, so a node whose client went silent for its ttl powers off and stays "
            "stopped (its disk still billed) until the pool's teardown or `skyward-iac gc` "
            "deletes it. Set sky.GCP(service_account=None) to skip the attempt, or give an "
            "account an admin created with service_account='NAME@PROJECT.iam.gserviceaccount"
            ".com' (see docs/providers.md, 'GCP: what the nodes run as').")


def _says(text: str, markers: Sequence[str]) -> bool:
    lowered = text.lower()
    return any(marker.lower() in lowered for marker in markers)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else text.strip())[:200]


# -- names and grants (pure) -------------------------------------------------------------------


def service_account_id(stack_name: str) -> str:
    """A service-account id for the stack (6-30 chars: lowercase, digits, '-'). Ids are
    global in a project and 30 characters cut most stack names, so a hash of the whole name
    ends it: two long names that share their first 21 characters never collide."""
    digest = hashlib.sha256(stack_name.encode()).hexdigest()[:8]
    return common.gcp_name(f"skyward-{stack_name}", digest, limit=30)


def self_delete_role_id(stack_name: str) -> str:
    """The custom role's id (``[a-zA-Z0-9_.]{3,64}``, unique in the project). A deleted role's
    id cannot be used again for 37 days; stack names are never reused, and the hash keeps two
    names that share their first 40 characters apart."""
    digest = hashlib.sha256(stack_name.encode()).hexdigest()[:8]
    base = re.sub(r"[^a-zA-Z0-9]+", "_", stack_name).strip("_")[:40].rstrip("_")
    return f"skyward_{base}_{digest}"


def storage_scopes(volumes: Sequence[Volume]) -> list[str]:
    """The node's OAuth scopes: Cloud Storage read-write when a volume writes, else read-only."""
    return [STORAGE_READ_ONLY if all(v.read_only for v in volumes) else STORAGE_READ_WRITE]


def bucket_roles(volumes: Sequence[Volume]) -> dict[str, str]:
    """The role the nodes' service account gets on each bucket (read-write wins per bucket)."""
    roles: dict[str, str] = {}
    for volume in volumes:
        if not volume.read_only or volume.bucket not in roles:
            roles[volume.bucket] = OBJECT_VIEWER if volume.read_only else OBJECT_USER
    return dict(sorted(roles.items()))


def node_scopes(plan: ClusterPlan) -> list[str]:
    """The nodes' OAuth scopes: Compute (the watchdog deletes its instance) with a ttl, and
    Cloud Storage for bucket volumes."""
    scopes = [COMPUTE_SCOPE] if plan.ttl > 0 else []
    return scopes + (storage_scopes(plan.identity_volumes) if plan.identity_volumes else [])


# -- resources ---------------------------------------------------------------------------------


class NodeAccount:
    """The nodes' account as the instances' ``service_account`` block, and the self-delete
    role to bind on each instance (None: no fire-path grant)."""

    def __init__(self, email: pulumi.Input[str], scopes: list[str],
                 role: pulumi.Input[str] | None) -> None:
        self.email = pulumi.Output.from_input(email)
        self.block = gcp.compute.InstanceServiceAccountArgs(email=email, scopes=scopes)
        self.role = role

    @property
    def member(self) -> pulumi.Output[str]:
        return self.email.apply(lambda email: f"serviceAccount:{email}")

    def bind_self_delete(self, index: int, instance: gcp.compute.Instance, zone: str,
                         opts: pulumi.ResourceOptions) -> None:
        """Let node ``index``'s account delete that node's instance (nothing else)."""
        if self.role is not None:
            gcp.compute.InstanceIAMMember(
                f"node-{index}-{BINDING}", instance_name=instance.name, zone=zone,
                role=self.role, member=self.member, opts=opts)


def declare_identity(plan: ClusterPlan, identity: NodeIdentity,
                     opts: pulumi.ResourceOptions) -> NodeAccount | None:
    """Declare the account (``own``), the self-delete role and the bucket grants of
    ``identity``; None when the nodes run without an account. A dedicated account holds no
    project role at all; everything it is granted goes with the stack."""
    if identity.account == "none":
        return None
    if identity.account == "own":
        email: pulumi.Input[str] = gcp.serviceaccount.Account(
            ACCOUNT, account_id=service_account_id(plan.stack_name),
            display_name=f"skyward_iac {plan.stack_name} nodes",
            description="the nodes of this stack: delete their own instance, mount their volumes",
            opts=opts,
        ).email
    else:
        assert identity.email is not None
        email = identity.email
    account_role = gcp.projects.IAMCustomRole(
        ROLE, role_id=self_delete_role_id(plan.stack_name),
        title=f"skyward_iac {plan.stack_name} self-delete"[:100],
        description="lets a node of this stack delete its own instance (bound per instance)",
        permissions=list(SELF_DELETE_PERMISSIONS), opts=opts,
    ).name if identity.self_delete else None
    account = NodeAccount(email, node_scopes(plan), account_role)
    for bucket, role in (identity.buckets or {}).items():
        gcp.storage.BucketIAMMember(f"volumes-{bucket}", bucket=bucket, role=role,
                                    member=account.member, opts=opts)
    return account
