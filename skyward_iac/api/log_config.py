"""``sky.LogConfig``: where and how much skyward logs (applied by ``observability/logging.py``)."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from skyward_iac.api.errors import ConfigError

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KIB|MIB|GIB)\s*$", re.IGNORECASE)
_TIME = re.compile(r"^\s*(\d+)\s*(minute|hour|day|week)s?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1024, "kib": 1024, "mb": 1024**2, "mib": 1024**2,
               "gb": 1024**3, "gib": 1024**3}
_TIME_UNITS = {"minute": "M", "hour": "H", "day": "D", "week": "W0"}


@dataclass(frozen=True, slots=True)
class Rotation:
    """A parsed ``rotation``: by size (``max_bytes``) or by time (``when`` x ``interval``)."""

    max_bytes: int = 0
    when: str = ""
    interval: int = 1


def parse_rotation(text: str) -> Rotation:
    """``"50 MB"`` -> rotate at 50 MiB; ``"1 day"``/``"6 hours"``/``"1 week"`` -> by time."""
    if match := _SIZE.match(text):
        size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
        if size > 0:
            return Rotation(max_bytes=size)
    elif (match := _TIME.match(text)) and int(match.group(1)) > 0:
        return Rotation(when=_TIME_UNITS[match.group(2).lower()], interval=int(match.group(1)))
    raise ConfigError(
        f"LogConfig.rotation must be a size such as '50 MB' (units B, KB, MB, GB) or a time "
        f"such as '1 day' (minutes, hours, days, weeks), got {text!r}"
    )


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Where and how much skyward logs: ``sky.LogConfig(level="DEBUG", console=False)``.

    ``file`` None disables the file; ``console`` echoes warnings and errors to stderr;
    ``rotation`` is a size (``"50 MB"``) or a period (``"1 day"``); ``retention`` how many
    rotated files are kept.
    """

    level: str = "INFO"
    file: str | None = "~/.skyward/logs/skyward.log"
    console: bool = True
    rotation: str = "50 MB"
    retention: int = 10
    _rotation: Rotation = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.level, str) or self.level.upper() not in LEVELS:
            raise ConfigError(f"LogConfig.level must be one of {', '.join(LEVELS)}, "
                              f"got {self.level!r}")
        if isinstance(self.retention, bool) or not isinstance(self.retention, int) \
                or self.retention < 0:
            raise ConfigError(f"LogConfig.retention must be a whole number of rotated files "
                              f">= 0, got {self.retention!r}")
        object.__setattr__(self, "level", self.level.upper())
        object.__setattr__(self, "_rotation", parse_rotation(self.rotation))

    @property
    def levelno(self) -> int:
        """The numeric level (``TRACE`` is 5)."""
        return TRACE if self.level == "TRACE" else int(logging.getLevelName(self.level))

    def path(self) -> Path | None:
        """The log file, ``~/.skyward`` read as ``$SKYWARD_HOME`` when that is set."""
        if self.file is None:
            return None
        text = self.file
        if (home := os.environ.get("SKYWARD_HOME")) and text.startswith("~/.skyward/"):
            text = str(Path(home) / text.removeprefix("~/.skyward/"))
        return Path(text).expanduser()
