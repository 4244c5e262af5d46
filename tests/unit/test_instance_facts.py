"""``sky.instance_info().accelerator`` and ``.network``: from the offer and from the node."""

from __future__ import annotations

from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ConfigError
from skyward_iac.api.spec import validated
from skyward_iac.infra.capacity import offers
from skyward_iac.node.facts import interface_speed_gbps, network_facts, route_interface
from skyward_iac.orchestration.plan import accelerator_info

ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t0000000A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
ib0\t0010000A\t00000000\t0001\t0\t0\t0\t00F0FFFF\t0\t0\t0
"""


@pytest.mark.parametrize("address, interface", [
    ("10.0.1.7", "eth0"),        # the 10.0.0.0/16 route
    ("10.0.16.3", "ib0"),        # the more specific 10.0.16.0/20 wins
    ("93.184.216.34", "eth0"),   # the default route
    ("127.99.1.2", "lo"),        # Local nodes live on loopback addresses
    ("not-an-ip", None),
])
def test_the_interface_towards_the_head_is_the_most_specific_route(address: str,
                                                                   interface: str | None) -> None:
    assert route_interface(address, ROUTES) == interface


def test_interface_speed_is_read_from_sysfs(tmp_path: Path) -> None:
    (tmp_path / "eth0").mkdir()
    (tmp_path / "eth0" / "speed").write_text("25000\n")
    (tmp_path / "veth").mkdir()
    (tmp_path / "veth" / "speed").write_text("-1\n")
    assert interface_speed_gbps("eth0", tmp_path) == 25.0
    assert interface_speed_gbps("veth", tmp_path) is None
    assert interface_speed_gbps("missing", tmp_path) is None


def test_a_local_node_reports_loopback() -> None:
    assert network_facts("127.88.3.4") == {"interface": "lo", "bandwidth_gbps": None}


def test_the_accelerator_comes_from_the_offer() -> None:
    spec = sky.Spec(provider=sky.AWS(), accelerator=sky.accelerators.A100(count=8))
    choice = offers.select([spec])
    info = accelerator_info(choice.offer)
    assert info is not None
    assert (info.type, info.count) == ("A100", 8)
    assert info.memory_gb == choice.offer.accelerator_memory_gb and info.memory_gb
    assert accelerator_info(offers.select([sky.Spec(provider=sky.AWS())]).offer) is None
    trainium = next(o for o in offers.packaged_catalog("aws").offers if o.accelerator == "Trainium")
    assert accelerator_info(trainium).is_trainium  # type: ignore[union-attr]


def test_local_with_an_accelerator_is_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="Local nodes have no accelerator"):
        validated(sky.Spec, provider=sky.Local(), accelerator=sky.accelerators.A100())
