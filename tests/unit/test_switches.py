"""One reading of the environment's default-on switches (api/switches.py)."""

from __future__ import annotations

import pytest

from skyward_iac.api.switches import switched_on


@pytest.mark.parametrize("value", ["0", "false", "no", "off", "OFF", " Off ", "FALSE", "No"])
def test_every_spelling_of_off_turns_a_switch_off(value: str) -> None:
    assert not switched_on("SKYWARD_X", {"SKYWARD_X": value})


@pytest.mark.parametrize("value", ["1", "true", "on", "yes", "", "2", "offline"])
def test_anything_else_or_nothing_leaves_it_on(value: str) -> None:
    assert switched_on("SKYWARD_X", {"SKYWARD_X": value})
    assert switched_on("SKYWARD_X", {})


def test_the_process_environment_is_read_when_none_is_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_X", "off")
    assert not switched_on("SKYWARD_X")
    monkeypatch.delenv("SKYWARD_X")
    assert switched_on("SKYWARD_X")
