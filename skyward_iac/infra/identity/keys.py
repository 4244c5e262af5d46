"""SSH key material: ed25519 pairs in OpenSSH formats, and the random agent token."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True, slots=True)
class KeyPair:
    """An ed25519 key pair: ``private_pem`` (OpenSSH PEM) and ``public`` (``ssh-ed25519 AAAA...``)."""

    private_pem: str
    public: str

    def __repr__(self) -> str:  # never print the private half
        return f"KeyPair(public={self.public!r})"


def generate_keypair(comment: str = "") -> KeyPair:
    """A fresh ed25519 pair; ``comment`` is appended to the public line."""
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    return KeyPair(private_pem, f"{public} {comment}".strip())


def generate_token() -> str:
    """A per-stack secret the agent demands before it reads any pickle."""
    return secrets.token_urlsafe(32)
