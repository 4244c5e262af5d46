"""A run's nodes over time, as its stack's ``segments`` tag records them, and what they add up
to: node-hours and USD integrated over every resize and fallback.

A segment starts when the stack's declared node count or hourly rate changes (a resize, a spot
fallback, a capacity failover); it lasts until the next one starts, the last until the run
ended. Its start is in seconds after the stack was created, measured by the owner's monotonic
clock, so no two machines' clocks are compared. Stored compactly, ``START:NODES:USD_PER_HOUR``
separated by spaces (``0:2:0.83 3612:4:1.66``). Tag values are short (``tags.MAX_TAG_VALUE``),
so past ``MAX_SEGMENT_CHUNKS`` chunks the oldest segments are folded into one, marked ``~``,
whose node count and rate are the time-weighted means over its span: the totals stay exact,
only the detail of the earliest changes is lost.

Pure functions; ``orchestration/cost.py`` (the owner's ``CostMeter``) produces the segments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from skyward_iac.infra.stacks.tags import SEGMENTS, word_chunks

#: At most this many ``segments`` tags (``segments``, ``segments.1`` ...): each is one engine
#: command when it changes, and a tag value is at most ``MAX_TAG_VALUE`` characters.
MAX_SEGMENT_CHUNKS = 4


@dataclass(frozen=True, slots=True)
class Segment:
    """From ``start_s`` seconds after the stack's creation: ``nodes`` declared at
    ``usd_per_hour`` in all (a folded segment: time-weighted means over its span)."""

    start_s: float
    nodes: float
    usd_per_hour: float
    folded: bool = False


def _number(value: float, places: int) -> str:
    text = f"{value:.{places}f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def encode(segments: Sequence[Segment]) -> str:
    """The stored form (see the module doc)."""
    return " ".join(f"{'~' if s.folded else ''}{int(s.start_s)}:{_number(s.nodes, 3)}:"
                    f"{_number(s.usd_per_hour, 4)}" for s in segments)


def decode(text: str) -> list[Segment]:
    """The inverse of ``encode``, ordered by start; entries that do not parse are skipped (a
    reader between two writes of the chunks may see one twice: kept once)."""
    found: dict[int, Segment] = {}
    for word in text.split():
        folded = word.startswith("~")
        try:
            start, nodes, rate = word.removeprefix("~").split(":")
            found[int(start)] = Segment(float(start), float(nodes), float(rate), folded)
        except ValueError:
            continue
    return [found[start] for start in sorted(found)]


def fits(segments: Sequence[Segment]) -> bool:
    """Whether ``segments`` are stored in at most ``MAX_SEGMENT_CHUNKS`` tags."""
    return len(word_chunks(encode(segments).split())) <= MAX_SEGMENT_CHUNKS


def fold(segments: Sequence[Segment]) -> list[Segment]:
    """``segments`` with the oldest ones folded into one until they fit (the last segment,
    whose end is not known yet, is never folded)."""
    kept = list(segments)
    while len(kept) > 2 and not fits(kept):
        first, second, third = kept[0], kept[1], kept[2]
        weights = (second.start_s - first.start_s, third.start_s - second.start_s)
        kept[:2] = [Segment(first.start_s, _mean((first.nodes, second.nodes), weights),
                            _mean((first.usd_per_hour, second.usd_per_hour), weights),
                            folded=True)]
    return kept


def _mean(values: tuple[float, float], weights: tuple[float, float]) -> float:
    """The weighted mean of two values (the second when both weights are zero)."""
    total = weights[0] + weights[1]
    return (values[0] * weights[0] + values[1] * weights[1]) / total if total > 0 else values[1]


def merge(stored: Sequence[Segment], fresh: Sequence[Segment]) -> list[Segment]:
    """The stack's segments after its owner recorded ``fresh`` ones: the stored ones that
    start before the first fresh one stay (a warm pool's earlier runs, whose meter was
    another process's), then the fresh ones, folded to fit."""
    if not fresh:
        return fold(stored)
    return fold([s for s in stored if s.start_s < fresh[0].start_s] + list(fresh))


def of_tags(tags: Mapping[str, str]) -> list[Segment]:
    """A run's segments from its decoded tags; a run without any (no resize yet, or recorded
    before segments were) is one segment: its ``nodes`` at its ``usd_per_hour`` throughout."""
    if segments := decode(tags.get(SEGMENTS, "")):
        return segments
    try:
        return [Segment(0.0, float(tags.get("nodes") or 0), float(tags.get("usd_per_hour") or 0))]
    except ValueError:
        return [Segment(0.0, 0.0, 0.0)]


@dataclass(frozen=True, slots=True)
class Totals:
    """What a run used: node-hours and USD, over ``duration_s``."""

    node_hours: float
    cost_usd: float


def totals(segments: Sequence[Segment], duration_s: float) -> Totals:
    """Node-hours and USD of ``segments`` for a run that lasted ``duration_s`` seconds (each
    segment until the next starts, the last until the end; none past the end)."""
    node_hours = cost = 0.0
    for index, segment in enumerate(segments):
        end = segments[index + 1].start_s if index + 1 < len(segments) else duration_s
        hours = max(min(end, duration_s) - segment.start_s, 0.0) / 3600
        node_hours += segment.nodes * hours
        cost += segment.usd_per_hour * hours
    return Totals(node_hours, cost)
