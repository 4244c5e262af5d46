"""Local: nodes on this machine, each a sandbox with its own sshd (``programs/local.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from skyward_iac.infra.clouds.base import Cloud

if TYPE_CHECKING:
    from skyward_iac.infra.programs import ClusterRequest


class LocalCloud(Cloud):
    kind: ClassVar[str] = "local"
    on_this_machine: ClassVar[bool] = True

    def program(self, request: ClusterRequest) -> Callable[[], None]:
        from skyward_iac.infra.programs.local import local_program

        return local_program(request)

    def data_bind(self, private_address: str) -> str | None:
        """The node's own loopback address, on a port of the kernel's choice: many nodes
        share this machine, and no firewall stands between them and the client."""
        return private_address


LOCAL = LocalCloud()
