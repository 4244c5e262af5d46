"""The linearizability checker (tests/linearizability.py) on hand-made histories: it accepts
every legal interleaving of overlapping operations and rejects each kind of violation the
collections could show (a lost update, a stale read, two holders of a lock, FIFO broken)."""

from __future__ import annotations

import random
import time

from tests.linearizability import COUNTER, DICT, LOCK, QUEUE, Model, Op, check


def op(client: object, name: str, arg: object, result: object, call: int, ret: int) -> Op:
    return Op(client, name, arg, result, call, ret)


# -- counter ---------------------------------------------------------------------------------


def test_overlapping_increments_may_take_either_order() -> None:
    # b's increment overlaps a's, so b may have come first even though it was called later.
    history = [op("a", "add", 1, 2, 0, 10), op("b", "add", 1, 1, 5, 15)]
    assert check(COUNTER, history)


def test_two_increments_returning_the_same_value_are_a_lost_update() -> None:
    history = [op("a", "add", 1, 1, 0, 10), op("b", "add", 1, 1, 5, 15)]
    assert not check(COUNTER, history)


def test_an_increment_cannot_be_ordered_before_one_that_returned_before_it_began() -> None:
    # Sequential in real time (a returned at 10, b called at 20), results in the other order.
    history = [op("a", "add", 1, 2, 0, 10), op("b", "add", 1, 1, 20, 30)]
    assert not check(COUNTER, history)


def test_a_read_after_an_increment_returned_must_see_it() -> None:
    stale = [op("a", "add", 5, 5, 0, 10), op("b", "read", None, 0, 11, 12)]
    assert not check(COUNTER, stale)
    concurrent = [op("a", "add", 5, 5, 0, 10), op("b", "read", None, 0, 9, 12)]
    assert check(COUNTER, concurrent)


def test_reset_then_increment() -> None:
    history = [op("a", "reset", 10, None, 0, 1), op("b", "add", -3, 7, 2, 3),
               op("a", "read", None, 7, 4, 5)]
    assert check(COUNTER, history)
    assert not check(COUNTER, [*history[:2], op("a", "read", None, 10, 4, 5)])


# -- lock ------------------------------------------------------------------------------------


def test_lock_handed_over_in_turn() -> None:
    history = [op("a", "acquire", None, True, 0, 1), op("b", "acquire", None, True, 2, 8),
               op("a", "release", None, None, 5, 6), op("b", "release", None, None, 9, 10)]
    assert check(LOCK, history)


def test_two_holders_at_once_are_rejected() -> None:
    # b's acquire returned before a's release was even called.
    history = [op("a", "acquire", None, True, 0, 1), op("b", "acquire", None, True, 2, 3),
               op("a", "release", None, None, 5, 6), op("b", "release", None, None, 9, 10)]
    assert not check(LOCK, history)


# -- queue -----------------------------------------------------------------------------------


def test_fifo_order_is_required_between_sequential_puts() -> None:
    puts = [op("a", "put", 1, None, 0, 1), op("a", "put", 2, None, 2, 3)]
    assert check(QUEUE, [*puts, op("b", "get", None, 1, 4, 5), op("b", "get", None, 2, 6, 7)])
    assert not check(QUEUE, [*puts, op("b", "get", None, 2, 4, 5),
                             op("b", "get", None, 1, 6, 7)])


def test_concurrent_puts_may_be_got_in_either_order() -> None:
    puts = [op("a", "put", 1, None, 0, 10), op("b", "put", 2, None, 1, 9)]
    assert check(QUEUE, [*puts, op("c", "get", None, 2, 11, 12), op("c", "get", None, 1, 13, 14)])


def test_an_item_got_twice_or_an_empty_get_while_full_are_rejected() -> None:
    put = op("a", "put", 1, None, 0, 1)
    assert not check(QUEUE, [put, op("b", "get", None, 1, 2, 3), op("c", "get", None, 1, 4, 5)])
    assert not check(QUEUE, [put, op("b", "get", None, None, 2, 3)])
    assert check(QUEUE, [op("b", "get", None, None, 0, 3), op("a", "put", 1, None, 1, 2)])


# -- dict ------------------------------------------------------------------------------------


def test_dict_keys_are_checked_one_by_one() -> None:
    history = [op("a", "put", ("x", 1), None, 0, 1), op("a", "put", ("y", 2), None, 2, 3),
               op("b", "get", "x", 1, 4, 5), op("b", "pop", "y", 2, 6, 7),
               op("b", "get", "y", None, 8, 9)]
    assert check(DICT, history)
    stale = [*history[:2], op("b", "get", "x", None, 4, 5)]
    assert not check(DICT, stale)


# -- the search itself -----------------------------------------------------------------------


def _random_counter_history(rng: random.Random, clients: int, per_client: int,
                            lose_one: bool) -> list[Op]:
    """Increments by ``clients`` that overlap at random, with the results a real atomic
    counter gives (each takes effect at a random instant inside its interval); with
    ``lose_one`` two of them return the same value."""
    spans = []
    for client in range(clients):
        t = rng.randrange(5)
        for _ in range(per_client):
            call = t + rng.randrange(5)
            ret = call + 1 + rng.randrange(40)
            spans.append((client, call, ret, rng.uniform(call, ret)))
            t = ret + 1
    history = [op(client, "add", 1, value, call, ret) for value, (client, call, ret, _)
               in enumerate(sorted(spans, key=lambda s: s[3]), start=1)]
    if lose_one:
        victim = rng.randrange(1, len(history))
        history[victim] = op(history[victim].client, "add", 1, history[victim - 1].result,
                             history[victim].call, history[victim].ret)
    return history


def test_many_overlapping_operations_are_checked_quickly() -> None:
    rng = random.Random(7)
    for _ in range(5):
        good = _random_counter_history(rng, clients=8, per_client=40, lose_one=False)
        started = time.monotonic()
        assert check(COUNTER, good)
        assert time.monotonic() - started < 10  # the memo keeps it far below this
        assert not check(COUNTER, _random_counter_history(rng, 8, 40, lose_one=True))


def test_the_search_backtracks_past_a_first_choice_that_fails_later() -> None:
    # Registers: x := 1 and x := 2 overlap; the first read (1) forces 2 before 1, but a
    # greedy search that linearizes the earlier-called put first must undo that choice.
    register = Model(init=0, step=lambda s, o: (True, o.arg) if o.name == "w"
                     else (o.result == s, s))
    history = [op("a", "w", 1, None, 0, 10), op("b", "w", 2, None, 1, 9),
               op("c", "r", None, 1, 11, 12)]
    assert check(register, history)
    assert not check(register, [*history, op("c", "r", None, 2, 13, 14)])
