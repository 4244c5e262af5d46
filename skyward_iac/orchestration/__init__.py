"""Orchestration: a Compute block brings a stack up, connects its nodes and dispatches tasks."""
