"""One object per provider (``Cloud``, base.py) instead of branches on its kind.

``cloud(kind)`` gives the provider's object; ``cloud_of_stack(name)`` the one a stack named by
``new_stack_name`` (``aws-ana-...``) runs on.
"""

from __future__ import annotations

from collections.abc import Mapping

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.clouds.aws import AWS
from skyward_iac.infra.clouds.base import Cloud
from skyward_iac.infra.clouds.gcp import GCP
from skyward_iac.infra.clouds.local import LOCAL

CLOUDS: Mapping[str, Cloud] = {c.kind: c for c in (LOCAL, AWS, GCP)}

__all__ = ["AWS", "CLOUDS", "GCP", "LOCAL", "Cloud", "cloud", "cloud_of_stack"]


def cloud(kind: str) -> Cloud:
    """The object of provider ``kind``; ``ConfigError`` naming the known ones otherwise."""
    try:
        return CLOUDS[kind]
    except KeyError:
        raise ConfigError(f"provider {kind!r} is not one of {', '.join(CLOUDS)}; use "
                          "sky.Local(), sky.AWS() or sky.GCP()") from None


def cloud_of_stack(name: str) -> Cloud:
    """The provider of a stack named by ``new_stack_name`` (its first word), else Local."""
    return CLOUDS.get(name.split("-", 1)[0], LOCAL)
