"""A stack's secrets settings on a machine that never had them, taken from its state.

The engine encrypts a stack's secrets with the provider its settings file names
(``Pulumi.<stack>.yaml`` in the workspace: ``secretsprovider`` and ``encryptedkey`` for a KMS
key, ``encryptionsalt`` for a passphrase). That file lives on the machine that created the
stack. A teammate's machine, sharing only the backend, has none: its first update of the stack
(applying a reviewed plan, a forced ``down``) would make a new data key, and then fail to read
what the first one encrypted (``decrypting secret value: cipher: message authentication
failed``). The state names the provider it was written with (``deployment.secrets_providers``:
``{"type": "cloud", "state": {"url", "encryptedkey"}}`` or ``{"type": "passphrase", "state":
{"salt"}}``), so a stack selected where its settings are missing gets them from there: a KMS key
opens for whoever the key policy lets in, a passphrase for whoever knows it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pulumi import automation as auto

log = logging.getLogger("skyward")


def settings_from_state(providers: Mapping[str, Any] | None) -> auto.StackSettings | None:
    """The settings that open the secrets of a state whose ``secrets_providers`` is
    ``providers``; None when it names none or a kind we do not carry (the Pulumi service)."""
    kind = (providers or {}).get("type")
    state = (providers or {}).get("state") or {}
    if kind == "cloud" and state.get("url") and state.get("encryptedkey"):
        return auto.StackSettings(secrets_provider=state["url"],
                                  encrypted_key=state["encryptedkey"])
    if kind == "passphrase" and state.get("salt"):
        return auto.StackSettings(encryption_salt=state["salt"])
    return None


def has_secrets_settings(settings: auto.StackSettings) -> bool:
    """Whether the settings already say how the stack's secrets are encrypted."""
    return bool(settings.secrets_provider or settings.encrypted_key or settings.encryption_salt)


def adopt_secrets_settings(stack: auto.Stack) -> bool:
    """Give ``stack``'s workspace the secrets settings its state was written with, when it has
    none (one ``stack export``); whether it did. Config already there is kept."""
    workspace = stack.workspace
    try:
        current = workspace.stack_settings(stack.name)
    except FileNotFoundError:
        current = auto.StackSettings()
    if has_secrets_settings(current):
        return False
    found = settings_from_state(stack.export_stack().deployment.get("secrets_providers"))
    if found is None:
        return False
    found.config = current.config
    workspace.save_stack_settings(stack.name, found)
    log.debug("stack %s: secrets settings taken from its state (%s)", stack.name,
              found.secrets_provider or "passphrase")
    return True
