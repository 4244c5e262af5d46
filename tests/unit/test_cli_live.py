"""The pure parts of ``skyward-iac ls/down/logs``, and ``--help``/``--json`` on every command."""

from __future__ import annotations

import io
import threading
from datetime import UTC, datetime

import pytest

from skyward_iac.cli import main, parser
from skyward_iac.cli_commands.live import (
    PrefixedLines,
    describe,
    human_age,
    lease_text,
    owner_text,
    tail_command,
)

NOW = datetime(2026, 1, 2, 12, 0, 0, tzinfo=UTC)


def test_describe_measures_age_and_cost_to_now() -> None:
    tags = {"created_at": "2026-01-02T10:30:00+00:00", "usd_per_hour": "2.0000", "nodes": "4",
            "provider": "aws", "owner": "ana@box", "expires_at": "2026-01-02T10:40:00+00:00"}
    row = describe("aws-ana-x", tags, 9, NOW, owner_running=False)
    assert row.age_s == 5400.0
    assert row.cost_usd == 3.0  # 1.5 h at $2/h
    assert row.usd_per_hour == 2.0  # ls's USD/H column and ls --json's usd_per_hour
    assert (row.nodes, row.resources, row.provider, row.owner) == (4, 9, "aws", "ana@box")
    assert row.expires_at == "2026-01-02T10:40:00+00:00" and row.owner_running is False


@pytest.mark.parametrize(("lease_until", "shown"), [
    ("2026-01-02T12:00:25+00:00", "25s left"),
    ("2026-01-02T11:56:00+00:00", "lapsed 4m ago"),
    (None, "-"),
])
def test_ls_shows_the_lease(lease_until: str | None, shown: str) -> None:
    tags = {"owner": "bo@laptop", **({"lease_until": lease_until} if lease_until else {})}
    row = describe("gcp-bo-x", tags, 3, NOW, owner_running=False)
    assert lease_text(row) == shown
    assert row.lease_until == (lease_until or "")


def test_another_machines_lease_is_shown_as_judged_not_as_time_left() -> None:
    tags = {"owner": "bo@laptop", "lease_until": "2026-01-02T12:00:25+00:00"}
    row = describe("gcp-bo-x", tags, 3, NOW, owner_running=False,
                   owner_state=owner_text("elsewhere", "held"), lease_judged="held")
    assert lease_text(row) == "held" and row.lease_left_s is None
    assert row.owner_state == "alive elsewhere"


@pytest.mark.parametrize(("state", "judged", "shown"), [
    ("running", "", "running"), ("dead", "", "gone"), ("elsewhere", "held", "alive elsewhere"),
    ("elsewhere", "lapsed", "gone"), ("elsewhere", "", "elsewhere, no lease"),
])
def test_owner_text(state: str, judged: str, shown: str) -> None:
    assert owner_text(state, judged) == shown


def test_describe_tolerates_a_stack_without_tags() -> None:
    row = describe("odd", {}, 1, NOW, owner_running=False)
    assert (row.age_s, row.cost_usd, row.nodes, row.expires_at) == (None, 0.0, 0, "never")


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "?"), (-3, "0s"), (42, "42s"), (420, "7m"), (11520, "3h12m"), (187200, "2d4h"),
])
def test_human_age(seconds: float | None, shown: str) -> None:
    assert human_age(seconds) == shown


def test_prefixed_lines_prefix_complete_lines_only() -> None:
    target = io.StringIO()
    sink = PrefixedLines(3, target, threading.Lock())
    sink.write("first line\nsecond ")
    assert target.getvalue() == "[node 3] first line\n"
    sink.write("half\nthird\n")
    sink.write("tail without newline")
    sink.flush()
    assert target.getvalue().splitlines() == [
        "[node 3] first line", "[node 3] second half", "[node 3] third",
        "[node 3] tail without newline"]


def test_tail_command_quotes_the_workdir_and_follows_rotations() -> None:
    command = tail_command("/tmp/a dir/work", 50, follow=True)
    assert command.startswith("tail -q -n 50 -F ")
    assert "'/tmp/a dir/work/log/agent.log'" in command
    assert "-F" not in tail_command("/w", 5, follow=False)


def subcommands() -> list[str]:
    action = next(a for a in parser()._actions if a.dest == "command")
    return sorted(action.choices)  # type: ignore[arg-type]


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    names = subcommands()
    assert {"ls", "down", "logs", "gc", "history", "offers", "show", "preview",
            "version"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: skyward-iac {name}"), name


@pytest.mark.parametrize("name", ["ls", "history", "offers", "gc", "show", "version"])
def test_every_listing_command_takes_json(name: str) -> None:
    action = next(a for a in parser()._actions if a.dest == "command")
    options = {o for a in action.choices[name]._actions  # type: ignore[index]
               for o in a.option_strings}
    assert "--json" in options


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["down"], ["logs"], ["ls", "--bogus"], ["logs", "s", "--node", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2, argv
        assert "usage: skyward-iac" in capsys.readouterr().err
