"""A ``Spec`` and ``ClusterRequest`` from plain settings: Pulumi stack config or CLI flags.

The Pulumi projects in ``stacks/`` read their stack's ``skyward:*`` config keys here, and
``skyward-iac preview``/``offers`` their flags, so both describe a pool with the same names::

    pulumi config set skyward:nodes 2
    pulumi config set skyward:accelerator L4

Values may be strings (all Pulumi config is text) or already typed. Unknown keys are an
error, so a typo in a stack config fails the preview instead of being silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from skyward_iac.api import accelerators
from skyward_iac.api.accelerators import Accelerator
from skyward_iac.api.errors import ConfigError
from skyward_iac.api.providers import PROVIDER_CLASSES
from skyward_iac.api.spec import Spec, validated
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.capacity.offers import Offer
from skyward_iac.infra.clouds import cloud
from skyward_iac.infra.programs import ClusterRequest

NAMESPACE = "skyward"
PROVIDERS = tuple(PROVIDER_CLASSES)  # "local", "aws", "gcp"

#: Stack config key -> ``Spec`` field.
SPEC_KEYS = {
    "nodes": "nodes", "vcpus": "vcpus", "memoryGb": "memory_gb", "diskGb": "disk_gb",
    "architecture": "architecture", "allocation": "allocation", "region": "region",
    "maxHourlyCost": "max_hourly_cost", "ttl": "ttl",
}
#: Stack config keys whose values are numbers, and of which kind.
NUMBER_KEYS: dict[str, type[int | float]] = {
    "nodes": int, "vcpus": float, "memoryGb": float, "diskGb": int, "maxHourlyCost": float,
    "ttl": int}
ACCELERATOR_KEYS = ("accelerator", "acceleratorCount", "acceleratorMemory",
                    "acceleratorFormFactor")
#: Stack config key -> provider field, per provider.
PROVIDER_KEYS: dict[str, dict[str, str]] = {
    "local": {},
    "aws": {"sshCidr": "ssh_cidr", "useDefaultVpc": "use_default_vpc",
            "containerImage": "container_image"},
    "gcp": {"sshCidr": "ssh_cidr", "project": "project", "zone": "zone",
            "containerImage": "container_image", "serviceAccount": "service_account"},
}
#: Keys that shape a cloud stack rather than the spec (see ``cluster_request``).
REQUEST_KEYS = ("instanceType", "market", "maxLifetime", "createdAt")


def known_keys(provider: str) -> tuple[str, ...]:
    """Every setting ``provider`` understands, in documentation order."""
    provider_keys = _provider_keys(provider)
    request_keys = () if cloud(provider).on_this_machine else REQUEST_KEYS
    # Pins the program reads itself (programs/pins.py), e.g. awsAccountId or image; no Spec field.
    pinned = tuple(key for key in cloud(provider).pin_keys
                   if key not in provider_keys and key not in request_keys)
    return (*SPEC_KEYS, *ACCELERATOR_KEYS, *provider_keys, *request_keys, *pinned)


def _provider_keys(provider: str) -> dict[str, str]:
    if provider not in PROVIDER_KEYS:
        raise ConfigError(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    return PROVIDER_KEYS[provider]


def accelerator_named(name: str, *, count: float = 1, memory: str | None = None,
                      form_factor: str | None = None) -> Accelerator:
    """``"L4"`` -> ``sky.accelerators.L4()``, case-insensitive; other names become ``Custom``."""
    known = {key.lower(): key for key in accelerators.KNOWN}
    if (canonical := known.get(name.lower())) is None:
        return accelerators.Custom(name, count=count, memory=memory, form_factor=form_factor)
    factory = getattr(accelerators, canonical)
    options: dict[str, Any] = {"count": count}
    if memory is not None:
        options["memory"] = memory
    if form_factor is not None:
        options["form_factor"] = form_factor
    try:
        accelerator: Accelerator = factory(**options)
    except TypeError:  # memory or form_factor on an accelerator that has no such option
        raise ConfigError(f"{canonical} takes only: {factory.__signature__}") from None
    return accelerator


def spec_from_settings(provider: str, settings: Mapping[str, Any]) -> Spec:
    """The ``Spec`` that ``settings`` (stack config keys, without namespace) describe."""
    unknown = sorted(set(settings) - set(known_keys(provider)))
    if unknown:
        raise ConfigError(
            f"unknown {provider} setting(s) {', '.join(unknown)}; known: "
            f"{', '.join(known_keys(provider))}"
        )
    values = {k: v for k, v in settings.items() if v is not None and v != ""}
    fields: dict[str, Any] = {SPEC_KEYS[k]: v for k, v in values.items() if k in SPEC_KEYS}
    # All Pulumi config is text; Spec takes numbers only (api/model.py), so they are read here.
    for key, kind in NUMBER_KEYS.items():
        if key in values:
            fields[SPEC_KEYS[key]] = _number(kind, key, values[key])
    if "accelerator" in values:
        fields["accelerator"] = accelerator_named(
            str(values["accelerator"]),
            count=_number(float, "acceleratorCount", values.get("acceleratorCount", 1)),
            memory=values.get("acceleratorMemory"),
            form_factor=values.get("acceleratorFormFactor"),
        )
    elif extra := [k for k in ACCELERATOR_KEYS if k in values]:
        raise ConfigError(f"{', '.join(extra)} need(s) `accelerator` to be set too")
    provider_fields = {field: values[key] for key, field in _provider_keys(provider).items()
                       if key in values}
    if "use_default_vpc" in provider_fields:
        provider_fields["use_default_vpc"] = _flag("useDefaultVpc",
                                                   provider_fields["use_default_vpc"])
    fields["provider"] = validated(PROVIDER_CLASSES[provider], **provider_fields)
    return validated(Spec, **fields)


def cluster_request(provider: str, settings: Mapping[str, Any], stack_name: str) -> ClusterRequest:
    """The request a stack program declares: spec, node count and the optional pins.

    ``instanceType`` pins the offer (the cheapest region serving it), so a catalog update
    cannot swap the instance type under a reviewed stack; ``createdAt`` (ISO 8601) pins the
    ``expires_at`` tags, which otherwise move with every run when ``ttl`` is set.
    """
    if cloud(provider).on_this_machine and (
            cloud_only := sorted(set(settings) & set(REQUEST_KEYS))):
        raise ConfigError(f"{', '.join(cloud_only)} apply to aws and gcp stacks only")
    spec = spec_from_settings(provider, {k: v for k, v in settings.items()
                                         if k not in REQUEST_KEYS})
    offer = None
    if instance_type := settings.get("instanceType"):
        offer = _pinned_offer(spec, str(instance_type))
    market = settings.get("market") or None
    if market not in (None, "spot", "on-demand"):
        raise ConfigError(f"market must be 'spot' or 'on-demand', got {market!r}")
    lifetime = settings.get("maxLifetime")
    # 0 is "no cap", as a stack created without one stores it (programs/decisions.py).
    max_lifetime = (_number(int, "maxLifetime", lifetime) or None) if lifetime else None
    created = settings.get("createdAt")
    try:
        created_at = datetime.fromisoformat(str(created)) if created else None
    except ValueError:
        raise ConfigError(f"createdAt must be an ISO 8601 time such as "
                          f"2026-01-01T00:00:00+00:00, got {created!r}") from None
    return ClusterRequest(
        stack_name=stack_name, spec=spec, node_count=spec.nodes.desired, offer=offer,
        market=market, max_lifetime=max_lifetime,
        created_at=created_at, max_nodes=spec.nodes.max or spec.nodes.desired,
    )


def _pinned_offer(spec: Spec, instance_type: str) -> Offer:
    choices = offers.matching(spec)
    for choice in choices:
        if choice.offer.instance_type == instance_type:
            return choice.offer
    served = sorted({c.offer.instance_type for c in choices})
    raise ConfigError(f"instanceType {instance_type!r} does not serve this spec; matching "
                      f"types: {', '.join(served[:20])}")


def read_pulumi_config(namespace: str = NAMESPACE) -> dict[str, str]:
    """Every ``<namespace>:*`` key of the running stack's config, without the namespace.

    Inside a Pulumi program only. Secret values are returned as plain strings: none of the
    known keys is a secret.
    """
    from pulumi.runtime.config import CONFIG  # the SDK's own map; pulumi.Config cannot list

    prefix = f"{namespace}:"
    return {key.removeprefix(prefix): value for key, value in CONFIG.get().items()
            if key.startswith(prefix)}


def _number(kind: type[int | float], key: str, value: Any) -> Any:
    refused = ConfigError(f"{key} must be {_KIND_WORDS[kind]}, got {value!r}")
    # int(2.7) would quietly be 2: a fractional value of a whole-number key is refused.
    if isinstance(value, bool) or (kind is int and isinstance(value, float)
                                   and not value.is_integer()):
        raise refused
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise refused from None


_KIND_WORDS = {int: "a whole number (e.g. 2)", float: "a number (e.g. 2 or 2.5)"}


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise ConfigError(f"{key} must be true or false, got {value!r}")
