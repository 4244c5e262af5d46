"""Defaults are resolved once, in ``Options``: every reader of these knobs gets a number, and
None (what configs written when they were optional hold) means the default."""

from __future__ import annotations

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
