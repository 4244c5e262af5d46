"""``sky.LogConfig`` and the rotating file log of the ``skyward`` loggers.

``Options(logging=True)`` (the default) writes INFO and above to ``~/.skyward/logs/skyward.log``
(under ``$SKYWARD_HOME`` when set), rotated at 50 MB, 10 files kept; warnings and errors are
also echoed to stderr. Progress is the console's job (``Options.console``), so INFO records are
not echoed: they would print everything twice.

Nothing secret should reach a log call in the first place; as a safety net every record our
handlers write passes ``redact``, which blanks PEM blocks, tokens, passwords and keys.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.log_config import LogConfig
from skyward_iac.observability.streams import write_lines

#: Loggers configured: ``skyward`` (and ``skyward.*``) plus modules named by ``__name__``.
LOGGERS = ("skyward", "skyward_iac")
FORMAT = "%(asctime)s %(levelname)-7s %(name)s [%(threadName)s] %(message)s"
CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: ``extra=SHOWN``: a record of something a console already shows as an event (a node that
#: failed to start, a node lost): written to the log file, not echoed to stderr a second time.
SHOWN = {"skyward_shown": True}

# ---- redaction --------------------------------------------------------------------------

_SECRET_NAME = r"[\w.-]*(?:token|secret|passw(?:or)?d|passphrase|api[_-]?key|access[_-]?key|" \
               r"private[_-]?key|credential|authori[sz]ation)[\w.-]*"
_REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    # A whole PEM block, or a truncated one running to the end of the text.
    (re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----.*?(?:-----END \1-----|\Z)", re.DOTALL),
     r"-----BEGIN \1----- [redacted] -----END \1-----"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [redacted]"),
    (re.compile(rf"(?i)\b({_SECRET_NAME})(\"?'?\s*[:=]\s*\"?'?)([^\s\"',;}}]+)"),
     r"\1\2[redacted]"),
    (re.compile(r"://([^/\s:@]+):([^/\s@]+)@"), r"://\1:[redacted]@"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "[redacted-aws-key-id]"),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}|"
                r"AIza[0-9A-Za-z_-]{35}|ya29\.[0-9A-Za-z_-]{20,}|pul-[0-9a-f]{40})\b"),
     "[redacted-token]"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+"),
     "[redacted-jwt]"),
)


def redact(text: str) -> str:
    """``text`` with PEM blocks, tokens, passwords and cloud keys replaced by ``[redacted]``."""
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFormatter(logging.Formatter):
    """A formatter whose whole output (message, traceback, stack) passes ``redact``."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _TimeOfDayFormatter(RedactingFormatter):
    def __init__(self, fmt: str) -> None:
        super().__init__(fmt, datefmt="%H:%M:%S")


# ---- configure --------------------------------------------------------------------------

class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes: the rich console redirects
    it while its live view is up, and a handler holding the original would tear the view.
    A record is written as whole lines, never inside a line the user's code is printing
    (``streams.write_lines``)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        try:
            write_lines(self.stream, self.format(record) + self.terminator)
        except Exception:  # noqa: BLE001 - as StreamHandler.emit: reported, never raised
            self.handleError(record)

@dataclass
class ConfiguredLogging:
    """What ``configure_logging`` installed; ``close()`` removes it again."""

    handlers: list[logging.Handler]
    file: Path | None

    def close(self) -> None:
        """Detach and close the handlers (the file stays)."""
        for name in LOGGERS:
            for handler in self.handlers:
                logging.getLogger(name).removeHandler(handler)
        for handler in self.handlers:
            handler.close()
        self.handlers = []


_configuring = threading.Lock()
_installed: ConfiguredLogging | None = None


def configure_logging(config: LogConfig | bool,
                      stream: TextIO | None = None) -> ConfiguredLogging:
    """Install skyward's log handlers per ``config`` (``True``: defaults, ``False``: none).

    Idempotent: the handlers of a previous call are replaced, so several pools in one process
    do not write every line several times. ``stream`` is where the console echo goes
    (stderr by default).
    """
    with _configuring:  # pools provisioned in parallel (MultiPool) configure at the same time
        return _configure(config, stream)


def _configure(config: LogConfig | bool, stream: TextIO | None) -> ConfiguredLogging:
    global _installed
    if config is True:
        config = LogConfig()
    if _installed is not None:
        _installed.close()
    if config is False:
        _installed = ConfiguredLogging([], None)
        return _installed
    if not isinstance(config, LogConfig):
        raise ConfigError(f"logging must be True, False or sky.LogConfig(...), got {config!r}")
    handlers: list[logging.Handler] = []
    path = config.path()
    if path is not None:
        handlers.append(_file_handler(config, path))
    if config.console:
        echo = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
        echo.setLevel(max(config.levelno, logging.WARNING))
        echo.addFilter(lambda record: not getattr(record, "skyward_shown", False))
        echo.setFormatter(_TimeOfDayFormatter(CONSOLE_FORMAT))
        handlers.append(echo)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(config.levelno)
        for handler in handlers:
            logger.addHandler(handler)
    _installed = ConfiguredLogging(handlers, path)
    return _installed


def _file_handler(config: LogConfig, path: Path) -> logging.Handler:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        rotation = config._rotation
        handler: logging.Handler
        if rotation.max_bytes:
            handler = logging.handlers.RotatingFileHandler(
                path, maxBytes=rotation.max_bytes, backupCount=config.retention,
                encoding="utf-8")
        else:
            handler = logging.handlers.TimedRotatingFileHandler(
                path, when=rotation.when, interval=rotation.interval,
                backupCount=config.retention, encoding="utf-8")
        os.chmod(path, 0o600)  # logs may name hosts and stacks: keep them to their owner
    except OSError as exc:
        raise ConfigError(f"cannot write the log file {path}: {exc.strerror}; set "
                          "sky.LogConfig(file=...) to a writable path or file=None") from None
    handler.setLevel(config.levelno)
    handler.setFormatter(RedactingFormatter(FORMAT))
    return handler
