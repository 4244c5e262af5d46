"""terraform-provider-google's ``DiskImageDiffSuppress``, as the provider implements it.

A ``google_compute_instance`` stores the URL of the image its boot disk was made from
(``https://www.googleapis.com/compute/v1/projects/P/global/images/NAME``) and compares it with
the declared ``boot_disk.initialize_params.image``; ``image`` forces a new instance, so whether
this function suppresses the difference decides whether a running node is replaced. Without a
network call the provider can only match names: an image against a declared image, or an image
name against a declared family through a series of special cases (``-amd64``/``-arm64``
suffixes, Ubuntu LTS, COS, Fedora CoreOS, SLES, Windows). A family that matches none of them
(``ubuntu-accelerator-2204-amd64-with-nvidia-550``: ``amd64`` inside the name, not at its end)
is a difference at every update. Ported from google-beta/services/compute/resource_compute_disk.go
and image.go (v7.45.0; docs/providers.md "Replacement").
"""

from __future__ import annotations

import re
from typing import Any

_PROJECT = (r"(?:(?:[-a-z0-9]{1,63}\.)*(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?):)?"
            r"(?:[0-9]{1,19}|(?:[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?))")
_NAME = r"[-_a-zA-Z0-9]*"
_LINK = re.compile(rf"^https://www.googleapis.com/compute/[a-z0-9]+/projects/({_PROJECT})"
                   rf"/global/images/({_NAME})")
_UNIVERSE_LINK = re.compile(rf"^https://compute.[-_a-zA-Z0-9.]*/compute/[a-z0-9]+/projects/"
                            rf"({_PROJECT})/global/images/({_NAME})")
_PROJECT_FAMILY = re.compile(rf"projects/({_PROJECT})/global/images/family/({_NAME})$")
_PROJECT_IMAGE = re.compile(rf"projects/({_PROJECT})/global/images/({_NAME})$")
_GLOBAL_FAMILY = re.compile(rf"^global/images/family/({_NAME})$")
_GLOBAL_IMAGE = re.compile(rf"^global/images/({_NAME})$")
_FAMILY_SHORTHAND = re.compile(rf"^family/({_NAME})$")
_PROJECT_SHORTHAND = re.compile(rf"^({_PROJECT})/({_NAME})$")

_UBUNTU_LTS = re.compile(r"^ubuntu-(minimal-)?([0-9]+)(?:.*(arm64|amd64))?.*$")
_FEDORA = re.compile(r"^fedora-coreos-([0-9]+)-([0-9]+)-([0-9]+)-([a-zA-Z0-9]+)-gcp-"
                     r"(x86-64|aarch64)$")
_SUSE = re.compile(r"^sles-([0-9]+)-([0-9]+)-(v[0-9]+)-x86-64$")
_COS_LTS = re.compile(r"^cos-([0-9]+)-")
_WINDOWS_SQL = re.compile(r"^sql-(?:server-)?([0-9]{4})-([a-z]+)-windows-(?:server-)?"
                          r"([0-9]{4})(?:-r([0-9]+))?-dc-v[0-9]+$")
#: Short project names the provider expands (``ImageMap``).
PROJECT_ALIASES = {
    "centos": "centos-cloud", "coreos": "coreos-cloud", "debian": "debian-cloud",
    "fedora-coreos": "fedora-coreos-cloud", "opensuse": "opensuse-cloud", "rhel": "rhel-cloud",
    "rocky-linux": "rocky-linux-cloud", "sles": "suse-cloud", "ubuntu": "ubuntu-os-cloud",
    "windows": "windows-cloud", "windows-sql": "windows-sql-cloud",
}


def disk_image_suppressed(old: Any, new: Any) -> bool:
    """Whether the provider treats stored image URL ``old`` and declared ``new`` as the same
    image (no diff, so no replacement)."""
    found = _LINK.match(str(old or "")) or _UNIVERSE_LINK.match(str(old or ""))
    if found is None:
        return False
    project, name = found.group(1), found.group(2)
    new = str(new or "")
    if match := _PROJECT_FAMILY.search(new):
        return _same_project(project, match.group(1)) and family_matches(name, match.group(2))
    if match := _PROJECT_IMAGE.search(new):
        return _same_project(project, match.group(1)) and name == match.group(2)
    if match := _GLOBAL_FAMILY.match(new):
        return family_matches(name, match.group(1))
    if match := _GLOBAL_IMAGE.match(new):
        return name == match.group(1)
    if match := _FAMILY_SHORTHAND.match(new):
        return family_matches(name, match.group(1))
    if match := _PROJECT_SHORTHAND.match(new):
        return _same_project(project, match.group(1)) and (
            name == match.group(2) or family_matches(name, match.group(2)))
    return name == new or family_matches(name, new)


def _same_project(stored: str, declared: str) -> bool:
    return stored == PROJECT_ALIASES.get(declared, declared)


def family_matches(image: str, family: str) -> bool:
    """``diskImageFamilyEquals``: whether image name ``image`` belongs to ``family``, judged
    from the names alone."""
    if "-arm64" not in image and family.removesuffix("-amd64") in image:
        # The provider decides here and looks no further.
        return family.endswith("-amd64") if "-amd64" in image else not family.endswith("-amd64")
    if family.removesuffix("-arm64") in image:
        return family.endswith("-arm64") if "-arm64" in image else not family.endswith("-arm64")
    return any(rule(image, family) for rule in (
        _canonical, _fedora, _suse, _cos, _windows_sql, _windows))


def _canonical(image: str, family: str) -> bool:
    parts = _UBUNTU_LTS.match(image)
    if parts is None:
        return False
    arch = parts.group(3)
    suffix = f"-{arch}" if arch else ""
    return f"ubuntu-{parts.group(1) or ''}{parts.group(2)}-lts{suffix}" == family


def _fedora(image: str, family: str) -> bool:
    return _FEDORA.match(image) is not None and family.startswith("fedora-")


def _suse(image: str, family: str) -> bool:
    return _SUSE.match(image) is not None and family.startswith("sles-")


def _cos(image: str, family: str) -> bool:
    parts = _COS_LTS.match(image)
    return parts is not None and f"cos-{parts.group(1)}-lts" == family


def _windows_sql(image: str, family: str) -> bool:
    parts = _WINDOWS_SQL.match(image)
    if parts is None:
        return False
    sql, edition, windows, revision = parts.groups()
    edition = {"enterprise": "ent", "standard": "std", "express": "exp"}.get(edition, edition)
    expected = f"sql-{edition}-{sql}-win-{windows}" + (f"-r{revision}" if revision else "")
    return expected == family


def _windows(image: str, family: str) -> bool:
    return family.replace("windows-", "windows-server-", 1) in image.replace("-dc-", "-", 1)
