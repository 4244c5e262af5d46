"""Readable durations in seconds: ``sky.time.minutes(10)``, ``hours(2)``, ``days(1)``."""

from __future__ import annotations


def seconds(value: float) -> float:
    """``value`` seconds."""
    return float(value)


def minutes(value: float) -> float:
    """``value`` minutes, in seconds."""
    return float(value) * 60


def hours(value: float) -> float:
    """``value`` hours, in seconds."""
    return float(value) * 3600


def days(value: float) -> float:
    """``value`` days, in seconds."""
    return float(value) * 86400
