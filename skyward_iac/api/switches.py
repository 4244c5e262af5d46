"""Default-on switches read from the environment (``SKYWARD_LOCAL_SOCKET=0`` and the like).

One reading for all of them, so that every switch takes the same spellings: ``0``, ``false``,
``no`` or ``off`` in any case, spaces around ignored, turn it off; anything else, or nothing,
leaves it on. docs/configuration.md lists the switches.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: The values that turn a switch off (compared lowercased, stripped).
OFF = frozenset({"0", "false", "no", "off"})


def switched_on(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the default-on switch ``name`` is on in ``environ`` (this process's
    environment when None)."""
    value = (os.environ if environ is None else environ).get(name)
    return value is None or value.strip().lower() not in OFF
