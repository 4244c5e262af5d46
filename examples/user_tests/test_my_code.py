"""Tests of my_code.py against real Local pools: `pytest -p skyward_iac.testing`.

The `sky_pool` fixture comes from skyward_iac's pytest plugin; pytest.ini beside this file
sets its default size (`sky_pool_nodes = 2`), a marker asks for another one. Each size is
provisioned once for the whole session and destroyed at its end.
"""

import pytest
from my_code import nodes_answering, word_counts


def test_word_counts_runs_on_the_nodes(sky_pool):
    texts = ["the cat sat", "the dog sat", "a cat"] * 10
    assert word_counts(sky_pool, texts) == {"the": 20, "cat": 20, "sat": 20, "dog": 10, "a": 10}


def test_every_node_answers(sky_pool):
    assert nodes_answering(sky_pool) == [0, 1]


@pytest.mark.sky_pool(nodes=1)
def test_a_marker_asks_for_another_pool(sky_pool):
    assert nodes_answering(sky_pool) == [0]
