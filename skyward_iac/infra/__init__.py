"""Pulumi: the engine, stacks, capacity, identity and the programs that declare a cluster."""
