"""Your code: functions that take the pool to run on, so tests can hand them a real one."""

from collections import Counter

import skyward_iac as sky


@sky.function
def count_words(text: str) -> dict[str, int]:
    return dict(Counter(text.split()))


@sky.function
def node_index() -> int:
    return sky.instance_info().node


def word_counts(pool: sky.Pool, texts: list[str]) -> dict[str, int]:
    """Word counts over many texts, counted on the pool's nodes."""
    totals: Counter[str] = Counter()
    for counts in pool.map(count_words, texts):
        totals.update(counts)
    return dict(totals)


def nodes_answering(pool: sky.Pool) -> list[int]:
    """The index of every node of the pool, asked of each node itself."""
    return node_index() @ pool
