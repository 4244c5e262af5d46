"""Accelerator factories: every seed name, keyword-only options that apply, clear errors."""

from __future__ import annotations

import inspect

import pytest

import skyward_iac as sky
from skyward_iac.api.accelerators import KNOWN, Accelerator, parse_memory_gb, vendor_of

A = sky.accelerators
SEED_NAMES = ["H100", "H200", "B200", "A100", "A10G", "A40", "L4", "L40S", "T4", "V100",
              "RTX_4090", "RTX_A6000", "MI300X"]


@pytest.mark.parametrize("name", SEED_NAMES)
def test_every_seed_name_is_a_keyword_only_factory(name: str) -> None:
    factory = getattr(A, name)
    made = factory()
    assert isinstance(made, Accelerator) and made.name == name and made.count == 1
    assert made.memory == KNOWN[name].default_memory
    assert factory(count=8).count == 8
    assert factory(count=0.5).count == 0.5  # fractional shares are allowed
    with pytest.raises(TypeError):
        factory(2)
    assert name in A.__all__


def test_a100_memory_variants() -> None:
    assert A.A100().memory == "80GB"
    small = A.A100(memory="40GB", count=2)
    assert (small.name, small.memory, small.count) == ("A100", "40GB", 2)
    assert A.A100(memory="40 gb").memory == "40GB"
    assert small.memory_gb == 40.0


def test_form_factor_where_it_applies() -> None:
    assert A.H100(form_factor="SXM").form_factor == "SXM"
    assert A.H100(form_factor="pcie").form_factor == "PCIe"
    with pytest.raises(sky.ConfigError, match="form_factor must be one of 'SXM', 'PCIe', 'NVL'"):
        A.H100(form_factor="OAM")
    with pytest.raises(sky.ConfigError, match="T4 has no form_factor"):
        A.T4(form_factor="SXM")


def test_a_memory_the_part_does_not_come_in_is_refused_with_the_choices() -> None:
    with pytest.raises(sky.ConfigError, match=r"A100 comes with memory '80GB', '40GB'"):
        A.A100(memory="48GB")
    with pytest.raises(sky.ConfigError, match="Custom"):
        A.T4(memory="32GB")
    with pytest.raises(sky.ConfigError, match="look like '80GB'"):
        A.A100(memory="lots")
    assert A.T4(memory="16GB").memory == "16GB"  # the only size is accepted explicitly


def test_signatures_show_only_the_options_that_apply() -> None:
    assert list(inspect.signature(A.T4).parameters) == ["count"]
    assert list(inspect.signature(A.A100).parameters) == ["count", "memory", "form_factor"]
    assert list(inspect.signature(A.L40S).parameters) == ["count"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY
               for p in inspect.signature(A.H100).parameters.values())


def test_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="greater than 0"):
        A.L4(count=0)


def test_custom_accelerators_are_unchecked_but_normalized() -> None:
    custom = A.Custom("My-GPU", memory="48 GB", count=2)
    assert (custom.name, custom.memory, custom.count) == ("My-GPU", "48GB", 2)
    assert A.Custom("tpu-v5-lite").memory is None
    assert vendor_of("My-GPU") == "other"


def test_vendors_and_memory_parsing() -> None:
    assert vendor_of("a100") == "nvidia" and vendor_of("MI300X") == "amd"
    assert vendor_of("Trainium2") == "aws" and vendor_of("TPU_V5P") == "google"
    assert parse_memory_gb("141GB") == 141.0 and parse_memory_gb("80") == 80.0


def test_accelerators_go_into_a_spec() -> None:
    spec = sky.Spec(provider=sky.AWS(), accelerator=A.H100(count=8, form_factor="SXM"))
    assert spec.accelerator == A.H100(count=8, form_factor="SXM")
    assert len(KNOWN) > len(SEED_NAMES)  # the catalog goes beyond the common names
