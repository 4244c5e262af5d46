"""Capacity: offers, placement policy, zone failover and spot fallback."""
