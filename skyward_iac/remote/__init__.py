"""Nodes, seen from the client: SSH connections, bootstrap, forwarding and the agent client."""
