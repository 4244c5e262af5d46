"""Defaults are resolved once, in ``Options``: every reader of these knobs gets a number, and
None (what configs written when they were optional hold) means the default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import skyward_iac as sky

DEFAULTS = {"provision_timeout": 600.0, "ssh_timeout": 30.0, "ssh_retry_interval": 1.0}


def test_the_defaults_are_numbers() -> None:
    options = sky.Options()
    assert {name: getattr(options, name) for name in DEFAULTS} == DEFAULTS


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_none_means_the_default_and_a_value_is_kept(name: str) -> None:
    assert getattr(sky.Options(**{name: None}), name) == DEFAULTS[name]
    assert getattr(sky.Options(**{name: 7}), name) == 7.0


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_a_non_positive_value_is_a_config_error(name: str) -> None:
    with pytest.raises(sky.ConfigError, match=name):
        sky.Options(**{name: 0})


def test_no_reader_falls_back_on_a_default_of_its_own() -> None:
    pattern = re.compile(r"\.(" + "|".join(DEFAULTS) + r")\s+or\b")
    package = Path(sky.__file__).parent
    found = [f"{path.relative_to(package)}:{number}"
             for path in sorted(package.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"a second default for these Options (resolved in Options): {found}"
