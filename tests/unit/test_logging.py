"""LogConfig validation, the rotating file log, the stderr echo and secret redaction."""

from __future__ import annotations

import io
import logging
import logging.handlers
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.log_config import LogConfig, Rotation, parse_rotation
from skyward_iac.observability.logging import ConfiguredLogging, configure_logging, redact

log = logging.getLogger("skyward.test")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    levels = {name: logging.getLogger(name).level for name in ("skyward", "skyward_iac")}
    yield
    configure_logging(False)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    return tmp_path


def test_defaults() -> None:
    config = LogConfig()
    assert (config.level, config.file, config.console, config.rotation, config.retention) == (
        "INFO", "~/.skyward/logs/skyward.log", True, "50 MB", 10)
    assert LogConfig(level="debug").level == "DEBUG" and LogConfig(level="TRACE").levelno == 5
    with pytest.raises(AttributeError):
        config.level = "DEBUG"  # type: ignore[misc]


@pytest.mark.parametrize(("text", "rotation"), [
    ("50 MB", Rotation(max_bytes=50 * 1024**2)), ("1kb", Rotation(max_bytes=1024)),
    ("0.5 GB", Rotation(max_bytes=512 * 1024**2)), ("100 B", Rotation(max_bytes=100)),
    ("1 day", Rotation(when="D", interval=1)), ("6 hours", Rotation(when="H", interval=6)),
    ("30 minutes", Rotation(when="M", interval=30)), ("1 week", Rotation(when="W0")),
])
def test_rotation_forms(text: str, rotation: Rotation) -> None:
    assert parse_rotation(text) == rotation


@pytest.mark.parametrize(("fields", "message"), [
    ({"level": "LOUD"}, "LogConfig.level must be one of TRACE, DEBUG, INFO, WARNING, ERROR, "
                        "got 'LOUD'"),
    ({"rotation": "often"}, "LogConfig.rotation must be a size such as '50 MB' (units B, KB, "
                            "MB, GB) or a time such as '1 day' (minutes, hours, days, weeks), "
                            "got 'often'"),
    ({"rotation": "0 MB"}, "got '0 MB'"),
    ({"rotation": "2 fortnights"}, "got '2 fortnights'"),
    ({"retention": -1}, "LogConfig.retention must be a whole number of rotated files >= 0, "
                        "got -1"),
    ({"retention": True}, "got True"),
])
def test_invalid_config_says_what_is_allowed(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        LogConfig(**fields)  # type: ignore[arg-type]
    assert message in str(error.value)


def test_default_file_lives_under_the_skyward_home(home: Path) -> None:
    configured = configure_logging(True)
    log.info("pool %s ready", "local-x")
    log.debug("not at INFO")
    assert configured.file == home / "logs" / "skyward.log"
    text = configured.file.read_text()
    assert "INFO    skyward.test" in text and "pool local-x ready" in text
    assert "not at INFO" not in text
    assert stat.S_IMODE(configured.file.stat().st_mode) == 0o600


def test_modules_logging_by_name_are_captured_too(home: Path) -> None:
    configured = configure_logging(LogConfig(level="DEBUG", console=False))
    logging.getLogger("skyward_iac.infra.stacks.stack").debug("engine said hi")
    assert configured.file is not None and "engine said hi" in configured.file.read_text()


def test_console_echo_is_warnings_only(home: Path) -> None:
    stream = io.StringIO()
    configure_logging(LogConfig(level="DEBUG"), stream=stream)
    log.info("progress is the console's job")
    log.warning("disk almost full")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith("WARNING skyward.test: disk almost full")
    assert lines[0][2] == ":" and lines[0][5] == ":"  # HH:MM:SS
    stream = io.StringIO()
    configure_logging(LogConfig(console=False, file=None), stream=stream)
    log.error("nowhere")
    assert stream.getvalue() == ""


def test_configuring_twice_does_not_duplicate_lines(home: Path) -> None:
    configure_logging(True)
    configured = configure_logging(LogConfig(console=False))
    log.info("once")
    assert configured.file is not None and configured.file.read_text().count("once") == 1
    assert sum(isinstance(h, logging.FileHandler)
               for h in logging.getLogger("skyward").handlers) == 1


def test_false_installs_nothing_and_close_removes(home: Path) -> None:
    assert configure_logging(False) == ConfiguredLogging([], None)
    assert not (home / "logs").exists()
    configured = configure_logging(True)
    configured.close()
    assert not [h for h in logging.getLogger("skyward").handlers
                if h in configured.handlers]
    with pytest.raises(ConfigError, match="logging must be True, False or sky.LogConfig"):
        configure_logging("yes")  # type: ignore[arg-type]


def test_size_rotation_keeps_retention_files(tmp_path: Path) -> None:
    path = tmp_path / "rot" / "skyward.log"
    configure_logging(LogConfig(file=str(path), rotation="1 KB", retention=2, console=False))
    for i in range(200):
        log.info("line %03d %s", i, "x" * 40)
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["skyward.log", "skyward.log.1", "skyward.log.2"]
    assert all(p.stat().st_size <= 1024 for p in path.parent.iterdir())
    assert "line 199" in path.read_text()


def test_time_rotation_rolls_over(tmp_path: Path) -> None:
    path = tmp_path / "timed.log"
    configured = configure_logging(LogConfig(file=str(path), rotation="1 day", retention=1,
                                             console=False))
    (handler,) = configured.handlers
    assert isinstance(handler, logging.handlers.TimedRotatingFileHandler)
    assert (handler.when, handler.interval, handler.backupCount) == ("D", 86400, 1)
    log.info("yesterday")
    handler.rolloverAt = 0  # the day is over
    log.info("today")
    rotated = [p for p in tmp_path.iterdir() if p.name.startswith("timed.log.")]
    assert len(rotated) == 1 and "yesterday" in rotated[0].read_text()
    assert "today" in path.read_text() and "yesterday" not in path.read_text()


def test_an_unwritable_file_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write the log file .*file=None"):
        configure_logging(LogConfig(file=str(blocker / "sub" / "x.log")))


PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
       "-----END OPENSSH PRIVATE KEY-----")


@pytest.mark.parametrize(("text", "secret"), [
    (f"key is {PEM} ok", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"),
    ("truncated -----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA", "MIIEpAIBAAKCAQEA"),
    ("agent_token=3f9a8b7c6d5e4f3a2b1c", "3f9a8b7c6d5e4f3a2b1c"),
    ('{"password": "hunter2hunter2"}', "hunter2hunter2"),
    ("PULUMI_CONFIG_PASSPHRASE=s3cr3t-pass", "s3cr3t-pass"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG", "wJalrXUtnFEMI/K7MDENG"),
    ("id AKIAIOSFODNN7EXAMPLE used", "AKIAIOSFODNN7EXAMPLE"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9abc", "eyJhbGciOiJIUzI1NiJ9abc"),
    ("clone https://bob:pa55word@example.com/repo", "pa55word"),
    ("github ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
])
def test_redact_blanks_secrets(text: str, secret: str) -> None:
    assert secret not in redact(text)
    assert "[redacted" in redact(text)


def test_redact_leaves_ordinary_text_alone() -> None:
    for text in ("pool local-root-1 ready in 3.8s (create 1.2s, up 1.7s)",
                 "token handshake failed for node 2", "node 0: bootstrap packages done"):
        assert redact(text) == text


def test_secrets_never_reach_the_file_even_in_tracebacks(home: Path) -> None:
    stream = io.StringIO()
    configured = configure_logging(True, stream=stream)
    log.info("host key %s", PEM)
    try:
        raise RuntimeError("token=abcdef0123456789 rejected")
    except RuntimeError:
        log.exception("handshake failed")
    assert configured.file is not None
    text = configured.file.read_text() + stream.getvalue()
    assert "b3BlbnNzaC1rZXkt" not in text and "abcdef0123456789" not in text
    assert "-----BEGIN OPENSSH PRIVATE KEY----- [redacted]" in text
    assert "Traceback" in text and "token=[redacted] rejected" in text


def test_the_stderr_echo_follows_sys_stderr(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configure_logging(True)
    redirected = io.StringIO()
    monkeypatch.setattr("sys.stderr", redirected)  # as the rich console's live view does
    log.warning("seen through the redirect")
    assert "seen through the redirect" in redirected.getvalue()
