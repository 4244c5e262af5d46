"""The team policy: one ``[policy]`` stored in the shared backend, next to the Pulumi state.

``skyward-iac policy push FILE`` writes it to ``<backend>/.skyward/policy.toml`` (a file
backend's directory, or the same bucket and prefix of an ``s3://`` backend); every client
reads it on every pool plan and apply (``policy.load``) and merges it strictest-wins with its
own ``[policy]`` and ``SKYWARD_POLICY``. It is read straight from the directory or the bucket
(boto3, the backend URL's own settings), not through an engine start.

The object says who pushed it, when, and a digest over its rules; a client checks the digest,
so an object edited by hand (or cut short) is refused. It fails closed: an object that cannot
be read or parsed, one that was there before and is gone now (this machine remembers the last
digest it read per backend), or a missing one where skyward.toml's ``[state] team_policy =
"required"`` says there must be one, stops every pool with a ``TeamPolicyError`` rather than
lifting the team's rules. To remove the rules, push an empty ``[policy]``.

Who may push is the backend's business: anyone with write access to the bucket (or directory)
can. docs/operations.md shows the bucket policy that keeps ``.skyward/policy.toml`` writable by
an ops role only. Backends other than ``file://`` and ``s3://`` hold no team policy here.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from skyward_iac import config_file
from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.engine import state_s3
from skyward_iac.infra.identity import cloud_identity
from skyward_iac.infra.stacks import home

#: Where the team policy lives, relative to the backend's root.
KEY = ".skyward/policy.toml"
FORMAT = 1


class TeamPolicyError(ConfigError):
    """The team policy exists (or existed) but cannot be read: nothing is provisioned."""


@dataclass(frozen=True, slots=True)
class Stored:
    """The team policy as stored: its rules (a ``[policy]`` table) and who pushed it."""

    rules: dict[str, Any]
    by: str
    by_source: str
    at: str
    digest: str
    where: str


def rules_digest(rules: dict[str, Any]) -> str:
    """``sha256:...`` over the rules, canonical JSON (key order and spacing do not count)."""
    text = json.dumps(rules, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def render(rules: dict[str, Any], by: str, by_source: str, at: str) -> str:
    """The stored object's text: a ``[pushed]`` record and the ``[policy]`` rules."""
    lines = ["# The team policy: written by `skyward-iac policy push`; edits by hand are",
             "# refused (the digest no longer matches).", "[pushed]",
             f"format = {FORMAT}", f"by = {json.dumps(by)}", f"by_source = {json.dumps(by_source)}",
             f"at = {json.dumps(at)}", f"digest = {json.dumps(rules_digest(rules))}", "",
             "[policy]"]
    for key in sorted(rules):
        value = rules[key]  # policy.parse checked it: a number or a list of strings
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def parse_stored(text: bytes, where: str) -> Stored:
    """The stored object read back; ``TeamPolicyError`` for anything not written by ``push``
    or edited since (its rules no longer have its digest)."""
    try:
        document = tomllib.loads(text.decode())
        pushed, rules = document["pushed"], document["policy"]
        stored = Stored(rules=dict(rules), by=str(pushed["by"]),
                        by_source=str(pushed["by_source"]), at=str(pushed["at"]),
                        digest=str(pushed["digest"]), where=where)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise TeamPolicyError(f"the team policy {where} cannot be read ({exc!r}); no pool "
                              "starts until ops push it again (`skyward-iac policy push "
                              "FILE`)") from None
    if pushed.get("format") != FORMAT:
        raise TeamPolicyError(f"the team policy {where} has format {pushed.get('format')!r}; "
                              f"this skyward_iac reads format {FORMAT}: upgrade skyward_iac")
    if rules_digest(stored.rules) != stored.digest:
        raise TeamPolicyError(f"the team policy {where} was changed after it was pushed (its "
                              f"rules do not have the digest {stored.digest}); no pool starts "
                              "until ops push it again (`skyward-iac policy push FILE`)")
    return stored


def location(url: str | None = None) -> str | None:
    """Where the team policy of backend ``url`` is (a path or an ``s3://`` URL); None for a
    backend that holds none here."""
    url = url or home.backend_url()
    if url.startswith("file://"):
        return str(Path(url.removeprefix("file://")) / KEY)
    if (where := state_s3.location(url)) is not None:
        return f"s3://{where.bucket}/{where.prefix}{KEY}"
    return None


def read(url: str | None = None) -> Stored | None:
    """The team policy of the backend (this machine's by default); None when none was ever
    pushed. Fails closed (``TeamPolicyError``) when it cannot be read, or when this machine
    read one from this backend before and it is gone now."""
    url = url or home.backend_url()
    where = location(url)
    required = _required()
    if where is None:
        if required:
            raise TeamPolicyError(f"[state] team_policy = \"required\", but the backend {url} "
                                  "cannot hold a team policy (file:// and s3:// backends do)")
        return None
    text = _get(url, where)
    if text is None:
        if required:
            raise TeamPolicyError(
                f"[state] team_policy = \"required\", but there is no team policy at {where}. "
                "No pool starts until ops push one (`skyward-iac policy push FILE`)")
        if (seen := _seen(url)) is not None:
            raise TeamPolicyError(
                f"the team policy {where} is gone: this machine read it before (digest "
                f"{seen.get('digest')}, pushed by {seen.get('by')} at {seen.get('at')}). No "
                "pool starts until it is back: ops restore it with `skyward-iac policy push "
                "FILE` (an empty [policy] removes the rules on purpose)")
        return None
    stored = parse_stored(text, where)
    _remember(url, stored)
    return stored


def push(rules: dict[str, Any], url: str | None = None, now: datetime | None = None) -> Stored:
    """Store ``rules`` (a checked ``[policy]`` table) as the team policy of the backend."""
    url = url or home.backend_url()
    where = location(url)
    if where is None:
        raise ConfigError(f"the backend {url} cannot hold a team policy: skyward_iac stores it "
                          "in file:// and s3:// backends only")
    s3 = state_s3.location(url)
    by, by_source = (_s3_actor(s3) if s3 is not None else cloud_identity.self_declared())
    at = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    text = render(rules, by, by_source, at)
    if s3 is not None:
        _s3_client(s3).put_object(Bucket=s3.bucket, Key=s3.prefix + KEY, Body=text.encode(),
                                  ContentType="application/toml")
    else:
        path = Path(where)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)  # whole or not at all: a reader never sees half a policy
    stored = parse_stored(text.encode(), where)
    _remember(url, stored)
    return stored


def _get(url: str, where: str) -> bytes | None:
    """The object's bytes, None when it does not exist; any other failure fails closed."""
    s3 = state_s3.location(url)
    try:
        if s3 is None:
            return Path(where).read_bytes()
        return bytes(_s3_client(s3).get_object(Bucket=s3.bucket,
                                               Key=s3.prefix + KEY)["Body"].read())
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - every failure but "not there" fails closed
        if _not_found(exc):
            return None
        raise TeamPolicyError(f"the team policy {where} cannot be read ({exc}); no pool starts "
                              "without it. Check the backend's credentials and network (the "
                              "same ones `skyward-iac ls` needs)") from None


def _required() -> bool:
    """Whether skyward.toml (or defaults.toml) says the backend must hold a team policy: a
    machine that never read one then fails closed too when it is missing."""
    value = config_file.state_setting("team_policy")
    if value not in (None, "required"):
        raise ConfigError(f"[state] team_policy must be \"required\" (or absent), got {value!r}")
    return value == "required"


def _not_found(exc: Exception) -> bool:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
    return code in ("NoSuchKey", "404", "NotFound")


def _s3_client(where: state_s3.Location) -> Any:
    return state_s3._client(where)


def _s3_actor(where: state_s3.Location) -> tuple[str, str]:
    """The caller's ARN from STS at the backend's endpoint (moto, MinIO and friends answer
    there), else ``user@host``, self-declared."""
    if where.endpoint is None:
        return cloud_identity.actor("aws")
    import boto3  # type: ignore[import-untyped]

    try:
        session = boto3.session.Session(profile_name=where.profile)
        identity = session.client("sts", endpoint_url=where.endpoint,
                                  region_name=where.region or "us-east-1").get_caller_identity()
        return str(identity["Arn"]), cloud_identity.AWS_STS
    except Exception:  # noqa: BLE001 - an S3 server without STS: the actor is self-declared
        return cloud_identity.self_declared()


def _seen_file(url: str) -> Path:
    name = hashlib.sha256(url.encode()).hexdigest()[:24]
    directory = home.skyward_home() / "team_policy"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory / f"{name}.json"


def _seen(url: str) -> dict[str, Any] | None:
    try:
        value = json.loads(_seen_file(url).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _remember(url: str, stored: Stored) -> None:
    """Note the policy read, so that its disappearance later is noticed (fail closed)."""
    record = {"backend": url, "digest": stored.digest, "by": stored.by, "at": stored.at}
    if _seen(url) != record:
        _seen_file(url).write_text(json.dumps(record) + "\n")
