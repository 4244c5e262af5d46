"""``skyward-iac offers`` (filters, sorting, --json, exit codes) and ``preview``'s usage errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.cli import main
from skyward_iac.infra.capacity import offers


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``skyward-iac argv``: (exit code, stdout, stderr); argparse's exits become codes too."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def offers_json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    code, out, err = run(capsys, "offers", *argv, "--json")
    assert code == 0, err
    rows: list[dict[str, Any]] = json.loads(out)["offers"]
    assert rows, "expected at least one offer"
    return rows


def test_sorted_by_price_across_both_clouds(capsys: pytest.CaptureFixture[str]) -> None:
    rows = offers_json(capsys, "--accelerator", "l4")  # names are case-insensitive
    prices = [r["hourly_usd"] for r in rows]
    assert prices == sorted(prices)
    assert {r["provider"] for r in rows} == {"aws", "gcp"}
    assert {r["accelerator"] for r in rows} == {"L4"}
    # The first row is what offer selection would pick for the same request.
    best = offers.select([sky.Spec(provider=sky.AWS(), accelerator=sky.accelerators.L4()),
                          sky.Spec(provider=sky.GCP(), accelerator=sky.accelerators.L4())])
    assert (rows[0]["instance_type"], rows[0]["hourly_usd"]) == (best.offer.instance_type,
                                                                  best.hourly)


def test_filters_narrow_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    rows = offers_json(capsys, "--provider", "aws", "--vcpus", "8", "--memory-gb", "32",
                       "--region", "us-west-2", "--max-hourly-cost", "0.5", "--on-demand")
    for row in rows:
        assert row["provider"] == "aws" and row["region"] == "us-west-2"
        assert row["vcpus"] >= 8 and row["memory_gb"] >= 32
        assert row["market"] == "on-demand" and row["hourly_usd"] <= 0.5
        assert row["accelerator"] is None  # no --accelerator: CPU-only, as a Spec without one
    everything = offers_json(capsys, "--provider", "aws", "--on-demand")
    assert len(rows) < len(everything)


def test_accelerator_count_memory_and_market(capsys: pytest.CaptureFixture[str]) -> None:
    rows = offers_json(capsys, "--accelerator", "A100", "--accelerator-memory", "40GB",
                       "--count", "8", "--spot")
    assert all(r["accelerator_count"] >= 8 and r["accelerator_memory_gb"] == 40 for r in rows)
    assert {r["market"] for r in rows} == {"spot"}


def test_text_output_and_limit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "offers", "--provider", "gcp", "--accelerator", "L4",
                       "--limit", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["PROVIDER", "INSTANCE", "TYPE"]
    # GCP L4 offers default to spot, whose shipped prices are estimates: marked, then explained.
    assert len(lines) == 5 and "(showing 2)" in lines[-2] and "not live quotes" in lines[-2]
    assert lines[-1].startswith("(est.): a typical spot price")
    assert all(line.endswith(" (est.)") for line in lines[1:3])
    first, second = (float(line.split()[-2]) for line in lines[1:3])
    assert first <= second


def test_nothing_matches_exits_1_naming_the_constraint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "offers", "--provider", "aws", "--accelerator", "H100",
                         "--max-hourly-cost", "1")
    assert code == 1 and out == ""
    assert err.startswith("skyward-iac: no AWS offer matches") and "max_hourly_cost" in err
    code, _, err = run(capsys, "offers", "--accelerator", "NoSuchGPU")
    assert code == 1 and "no AWS offer" in err and "no GCP offer" in err


@pytest.mark.parametrize("argv", [
    ["offers", "--provider", "azure"],
    ["offers", "--count", "2"],
    ["offers", "--vcpus", "-1"],
    ["offers", "--spot", "--on-demand"],
    ["preview"],
    ["preview", "--provider", "local", "--zone", "us-central1-a"],
    ["preview", "--provider", "local", "--hours", "-1"],
    ["preview", "--provider", "aws", "--nodes", "0"],
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and "usage: skyward-iac" in err


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0 and all(c in out for c in ("offers", "preview", "show", "version"))
    code, out, _ = run(capsys, "offers", "--help")
    assert code == 0 and "--max-hourly-cost" in out and "--json" in out
