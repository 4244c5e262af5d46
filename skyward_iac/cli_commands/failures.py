"""What ``skyward-iac`` says when an engine command failed for a reason outside skyward_iac: the
state backend unreachable, or refusing us. The engine's error text is classified once, here,
into a message with the next step (pure; ``cli.py`` prints it)."""

from __future__ import annotations

import re

#: Engine errors that mean the backend could not be reached at all (S3, GCS, Azure, HTTP).
UNREACHABLE = re.compile(
    r"connection refused|no such host|i/o timeout|network is unreachable|request send failed|"
    r"connection reset|TLS handshake timeout|dial tcp|context deadline exceeded", re.I)
#: Engine errors that mean the backend answered and refused these credentials.
DENIED = re.compile(
    r"AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|StatusCode: 403|"
    r"Forbidden|NoCredentialProviders|failed to refresh cached credentials", re.I)
NO_BUCKET = re.compile(r"NoSuchBucket|bucket does not exist|StatusCode: 404", re.I)
#: Only errors about the backend's own files are about the backend (a failing resource is not).
BACKEND_OBJECT = re.compile(r"\.pulumi/|blob \(key|bucket|backend", re.I)


def engine_failure(stderr: str, backend: str) -> str:
    """The message for an engine command that failed with ``stderr``, against ``backend``."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    detail = _cause(lines[-1]) if lines else "no message"
    if BACKEND_OBJECT.search(stderr):
        if NO_BUCKET.search(stderr):
            return (f"the state backend {backend} does not exist ({_short(detail)}). Create "
                    "it, or point SKYWARD_BACKEND_URL / [state] backend at the team's one.")
        if DENIED.search(stderr):
            return (f"the state backend {backend} refused this machine's credentials "
                    f"({_short(detail)}); nothing was changed. Check the credentials in force "
                    "(AWS_PROFILE, AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS) and "
                    "their permissions on the bucket, then run the command again.")
        if UNREACHABLE.search(stderr):
            return (f"the state backend {backend} cannot be reached ({_short(detail)}). "
                    "Check that it is up and reachable from here (network, VPN, endpoint in "
                    "the URL), then run the command again. Pools "
                    "already running are not affected: their nodes stop on their own ttl if "
                    "their client is gone.")
    return f"the Pulumi engine failed: {_short(detail)}"


def _cause(line: str) -> str:
    """The end of the engine's chain of causes: ``dial tcp 10.0.0.5:443: connect: connection
    refused`` out of ``error: read ...: operation error S3: ..., request send failed, ...``."""
    last = line.rsplit(", ", 1)[-1]
    return last[last.index("dial tcp"):] if "dial tcp" in last else last


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
