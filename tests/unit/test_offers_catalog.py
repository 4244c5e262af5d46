"""Which catalog offers come from: the shipped one or a newer refreshed one."""

from __future__ import annotations

from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.capacity import offers


@pytest.fixture(autouse=True)
def own_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))


def refreshed(as_of: str, price: float) -> dict[str, object]:
    data = offers.packaged_data("aws")
    rows = [{**row, "regions": {"us-east-1": {"on_demand": price, "spot": None}}}
            for row in data["instances"] if row["instance_type"] == "t3.medium"]
    return {**data, "as_of": as_of, "instances": rows}


def test_without_a_refresh_the_shipped_catalog_is_used() -> None:
    catalog = offers.current_catalog("aws")
    assert catalog is offers.packaged_catalog("aws") and not catalog.refreshed
    assert catalog.describe() == f"aws {catalog.as_of} (shipped)"


def test_a_newer_refresh_is_used_by_selection() -> None:
    path = offers.write_refreshed(refreshed("2099-01-01T00:00:00Z", 0.5))
    assert offers.current_catalog("aws").origin == str(path)
    choice = offers.select([sky.Spec(provider=sky.AWS(), allocation="on-demand")])
    assert (choice.offer.instance_type, choice.hourly) == ("t3.medium", 0.5)
    # A newer file replaces the cached one.
    offers.write_refreshed(refreshed("2099-01-02T00:00:00Z", 0.25))
    assert offers.select([sky.Spec(provider=sky.AWS(), allocation="on-demand")]).hourly == 0.25


def test_an_unreadable_refresh_names_the_file_and_the_fix() -> None:
    path = offers.refreshed_path("aws")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="offers refresh` again or delete the file") as caught:
        offers.current_catalog("aws")
    assert str(path) in str(caught.value)


def test_an_invalid_document_is_never_written() -> None:
    with pytest.raises(KeyError):
        offers.write_refreshed({"provider": "aws", "as_of": "2099-01-01", "instances": []})
    assert not offers.refreshed_path("aws").exists()
