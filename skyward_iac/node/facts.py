"""What a node knows about itself that the client cannot: the network interface its peers are
reached through and that interface's speed. The agent adds them to the ``InstanceInfo`` it is
configured with (``sky.instance_info().network``)."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any

#: Where Linux describes routes and interfaces.
PROC_ROUTE = Path("/proc/net/route")
SYS_NET = Path("/sys/class/net")


def route_interface(address: str, routes: str) -> str | None:
    """The interface the IPv4 routing table ``routes`` (``/proc/net/route``'s text) sends
    ``address`` through: the most specific matching route; loopback addresses go through
    ``lo``. None when nothing matches or ``address`` is not IPv4."""
    try:
        target = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    if target.is_loopback:
        return "lo"
    best: tuple[int, str] | None = None
    for line in routes.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        # Destination and mask are the kernel's u32s in host (little-endian) order, in hex.
        destination, mask = int(fields[1], 16), int(fields[7], 16)
        if int.from_bytes(target.packed, "little") & mask == destination:
            prefix = bin(mask).count("1")
            if best is None or prefix > best[0]:
                best = (prefix, fields[0])
    return best[1] if best else None


def interface_speed_gbps(interface: str, sys_net: Path = SYS_NET) -> float | None:
    """The link speed the kernel reports for ``interface`` in Gbit/s, or None when it reports
    none (loopback, most virtual NICs)."""
    try:
        mbps = int((sys_net / interface / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return mbps / 1000 if mbps > 0 else None


def network_facts(head_address: str) -> dict[str, Any]:
    """``NetworkInfo`` fields for this node: the interface towards the head (``lo`` on Local
    nodes, whose addresses are loopback ones) and its speed."""
    try:
        routes = PROC_ROUTE.read_text()
    except OSError:
        routes = ""
    interface = route_interface(head_address, routes)
    if interface is None:
        interface = "lo" if head_address in ("", "localhost", socket.gethostname()) else "unknown"
    return {"interface": interface, "bandwidth_gbps": interface_speed_gbps(interface)}
