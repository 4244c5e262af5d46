"""Public contracts: pure user-facing types, no I/O."""
