"""Pulumi: the engine, stacks and the programs that declare a cluster."""
