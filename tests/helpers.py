"""Inspecting what a stack left on this machine: processes and sandboxes of Local nodes."""

from __future__ import annotations

from pathlib import Path

from skyward_iac.infra.home import local_nodes_dir
from skyward_iac.processes import sandbox_processes


def stack_sandboxes(stack_name: str) -> list[Path]:
    """The node sandboxes of a stack that still exist on disk."""
    root = local_nodes_dir() / stack_name
    return sorted(root.glob("node-*")) if root.exists() else []


def stack_processes(stack_name: str) -> list[int]:
    """Live processes (sshd, agent, tasks) belonging to any sandbox of the stack."""
    root = local_nodes_dir() / stack_name
    return sandbox_processes(root)
