"""Nodes: SSH connections, bootstrap, the wire protocol and the agent that runs tasks."""
