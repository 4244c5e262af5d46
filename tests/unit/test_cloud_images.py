"""Every accelerator in the catalogs gets an image whose driver runs it (AWS and GCP)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from skyward_iac.api.accelerators import vendor_of
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.programs.aws import ami_query
from skyward_iac.infra.programs.common import DRIVER_RUNS
from skyward_iac.infra.programs.gcp import boot_image

ACCELERATED = sorted(
    {(o.provider, o.instance_type): o for provider in ("aws", "gcp")
     for o in offers.packaged_catalog(provider).offers if o.accelerator}.values(),
    key=lambda o: (o.provider, o.instance_type),
)


@pytest.mark.parametrize("offer", ACCELERATED, ids=lambda o: f"{o.provider}-{o.instance_type}")
def test_the_image_runs_the_accelerator(offer: offers.Offer) -> None:
    assert offer.accelerator is not None
    image = ami_query(offer) if offer.provider == "aws" else boot_image(offer)
    name = image.name if offer.provider == "aws" else image.family  # type: ignore[union-attr]
    if vendor_of(offer.accelerator) == "nvidia":
        assert image.driver is not None, f"{name} has no NVIDIA driver"
        assert DRIVER_RUNS[image.driver](offer.accelerator), (
            f"{offer.instance_type} ({offer.accelerator}) gets {name}, whose {image.driver} "
            "driver cannot run it")
    elif offer.accelerator in ("Trainium", "Inferentia2"):
        assert "Neuron" in name


def test_p3_gets_the_proprietary_driver_image() -> None:
    """P3 left the catalog (EC2 offers it in none of its regions: test_catalog_offerings.py);
    a V100 row a refreshed catalog may still list gets the driver that runs it."""
    g5 = next(o for o in ACCELERATED if o.instance_type.startswith("g5."))
    p3 = replace(g5, instance_type="p3.2xlarge", machine_type="p3.2xlarge", accelerator="V100")
    assert "Proprietary Nvidia Driver" in ami_query(p3).name
    assert "OSS Nvidia Driver" in ami_query(g5).name
