"""A function's kept pickle is never stale: after every change to what it is made of, the bytes
``pack_function`` gives are the bytes a fresh cloudpickle gives, and they run the new code or
values; while nothing changed, the function is not pickled again."""

from __future__ import annotations

import pickle
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pytest

from skyward_iac.api.function import PendingFunction
from skyward_iac.node import protocol
from skyward_iac.remote import function_pickles
from skyward_iac.remote.calls import pack_call, pack_function

SOURCE = """
K = 1
BIG = 10 ** 30
ITEMS = [1, 2]
TABLE = {"a": 1}
NAMES = frozenset({"x"})

def read_k():
    return K

def read_items():
    return list(ITEMS)

def read_table():
    return dict(TABLE)

def read_later():
    return LATER

def helper():
    return K * 10

def via_helper():
    return helper()

def with_default(x=3, *, y=4):
    return x + y

def uses_math():
    return math.floor(2.5)

def uses_floor():
    return floor(2.5)

def typed(x: int, y: list[int] | None = None, z: "str" = "") -> dict[str, int]:
    return {z: x}

def uses_package():
    return rttcpkg.sub.VALUE

def recursive(n):
    return 0 if n == 0 else recursive(n - 1)

class Box:
    pass

BOX = Box()

def read_box():
    return BOX
"""


@pytest.fixture
def scratch() -> Iterator[types.ModuleType]:
    """A module of the user's own code: pickled by value, its globals free to change."""
    module = types.ModuleType("rttc_scratch")
    module.__file__ = "/nonexistent/rttc_scratch.py"
    sys.modules[module.__name__] = module
    code = compile(textwrap.dedent(SOURCE), module.__file__, "exec", dont_inherit=True)
    exec(code, module.__dict__)  # noqa: S102
    module.math = __import__("math")
    module.floor = module.math.floor
    cloudpickle.register_pickle_by_value(module)
    function_pickles.forget()
    try:
        yield module
    finally:
        function_pickles.forget()
        if module.__name__ in cloudpickle.list_registry_pickle_by_value():
            cloudpickle.unregister_pickle_by_value(module)
        sys.modules.pop(module.__name__, None)


class Counting:
    """``protocol.dumps``, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn: Any) -> bytes:
        self.calls += 1
        return protocol.dumps(fn)


def fresh(fn: Any) -> bytes:
    return protocol.dumps(fn)


def check(fn: Callable[..., Any], dumps: Counting, *args: Any) -> Any:
    """The kept-or-made bytes equal a fresh pickle; returns what they run to."""
    blob = function_pickles.pickled(fn, dumps)
    assert blob == fresh(fn)
    return pickle.loads(blob)(*args)


def test_an_unchanged_function_is_pickled_once(scratch: types.ModuleType) -> None:
    dumps = Counting()
    for _ in range(5):
        assert check(scratch.read_k, dumps) == 1
    assert dumps.calls == 1


def test_a_rebound_global_is_seen(scratch: types.ModuleType) -> None:
    dumps = Counting()
    assert check(scratch.read_k, dumps) == 1
    scratch.K = 2
    assert check(scratch.read_k, dumps) == 2
    scratch.K = True  # equal to 1 but another object, another pickle
    assert check(scratch.read_k, dumps) is True
    assert dumps.calls == 3


def test_a_global_changed_in_place_is_seen(scratch: types.ModuleType) -> None:
    dumps = Counting()
    assert check(scratch.read_items, dumps) == [1, 2]
    scratch.ITEMS.append(3)
    assert check(scratch.read_items, dumps) == [1, 2, 3]
    scratch.ITEMS[0] = 9
    assert check(scratch.read_items, dumps) == [9, 2, 3]
    assert check(scratch.read_table, dumps) == {"a": 1}
    scratch.TABLE["a"] = 2
    assert check(scratch.read_table, dumps) == {"a": 2}
    scratch.TABLE["b"] = 3
    assert check(scratch.read_table, dumps) == {"a": 2, "b": 3}
    assert dumps.calls == 6


def test_a_global_defined_later_is_seen(scratch: types.ModuleType) -> None:
    dumps = Counting()
    with pytest.raises(NameError):
        check(scratch.read_later, dumps)
    scratch.LATER = "now"
    assert check(scratch.read_later, dumps) == "now"
    del scratch.LATER
    with pytest.raises(NameError):
        check(scratch.read_later, dumps)


def test_a_helper_function_s_globals_are_followed(scratch: types.ModuleType) -> None:
    dumps = Counting()
    assert check(scratch.via_helper, dumps) == 10
    assert check(scratch.via_helper, dumps) == 10
    scratch.K = 5  # read by the helper only
    assert check(scratch.via_helper, dumps) == 50
    scratch.helper = lambda: "replaced"
    assert check(scratch.via_helper, dumps) == "replaced"
    assert dumps.calls == 3


def test_defaults_code_and_attributes_are_seen(scratch: types.ModuleType) -> None:
    dumps = Counting()
    fn = scratch.with_default
    assert check(fn, dumps) == 7
    fn.__defaults__ = (10,)
    assert check(fn, dumps) == 14
    fn.__kwdefaults__["y"] = 0
    assert check(fn, dumps) == 10
    fn.tag = "marked"
    assert pickle.loads(function_pickles.pickled(fn, dumps)).tag == "marked"
    fn.__code__ = (lambda x=0, *, y=0: x * y).__code__
    assert check(fn, dumps) == 0
    fn.__doc__ = "documented"
    assert pickle.loads(function_pickles.pickled(fn, dumps)).__doc__ == "documented"
    assert dumps.calls == 6


def test_closure_cells_are_seen() -> None:
    function_pickles.forget()
    dumps = Counting()
    value: Any = 1

    def read() -> Any:
        return value

    assert check(read, dumps) == 1
    assert check(read, dumps) == 1
    value = [1]
    assert check(read, dumps) == [1]
    value.append(2)
    assert check(read, dumps) == [1, 2]
    assert dumps.calls == 3


def test_a_module_registered_or_not_by_value_changes_the_pickle(
        scratch: types.ModuleType) -> None:
    dumps = Counting()
    check(scratch.read_k, dumps)
    cloudpickle.unregister_pickle_by_value(scratch)  # now by reference (the module is imported)
    assert function_pickles.pickled(scratch.read_k, dumps) == fresh(scratch.read_k)
    cloudpickle.register_pickle_by_value(scratch)
    assert check(scratch.read_k, dumps) == 1
    assert dumps.calls == 3


def test_recursion_and_modules_by_reference_are_kept(scratch: types.ModuleType) -> None:
    dumps = Counting()
    for _ in range(3):
        assert check(scratch.recursive, dumps, 3) == 0
        assert check(scratch.uses_math, dumps) == 2
    assert dumps.calls == 2


def test_type_hints_are_kept(scratch: types.ModuleType) -> None:
    dumps = Counting()
    for _ in range(3):
        assert check(scratch.typed, dumps, 1) == {"": 1}
    assert dumps.calls == 1
    scratch.typed.__annotations__["x"] = float
    assert pickle.loads(function_pickles.pickled(scratch.typed, dumps)).__annotations__["x"] \
        is float
    assert dumps.calls == 2


def test_a_builtin_function_travels_by_name_while_its_module_has_it(
        scratch: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    dumps = Counting()
    assert check(scratch.uses_floor, dumps) == 2
    assert check(scratch.uses_floor, dumps) == 2
    assert dumps.calls == 1
    # Its module no longer holds it: pickled as today (pickle refuses it), never kept bytes.
    monkeypatch.setattr(scratch.math, "floor", lambda x: -1)
    assert function_pickles.fingerprint(scratch.uses_floor) is None
    with pytest.raises(pickle.PicklingError):
        function_pickles.pickled(scratch.uses_floor, dumps)


def test_a_newly_imported_submodule_of_a_used_package_is_seen(
        scratch: types.ModuleType) -> None:
    package = types.ModuleType("rttcpkg")
    package.__package__, package.__path__ = "rttcpkg", []
    sys.modules["rttcpkg"] = package
    scratch.rttcpkg = package
    try:
        dumps = Counting()
        first = function_pickles.pickled(scratch.uses_package, dumps)
        assert first == fresh(scratch.uses_package)
        sub = types.ModuleType("rttcpkg.sub")
        sub.__package__ = "rttcpkg"
        sys.modules["rttcpkg.sub"] = sub  # cloudpickle now names it for the node to import
        second = function_pickles.pickled(scratch.uses_package, dumps)
        assert second == fresh(scratch.uses_package) != first
        assert function_pickles.pickled(scratch.uses_package, dumps) == second
        assert dumps.calls == 2
    finally:
        sys.modules.pop("rttcpkg.sub", None)
        sys.modules.pop("rttcpkg", None)


def test_what_cannot_be_fingerprinted_is_pickled_every_time(scratch: types.ModuleType) -> None:
    dumps = Counting()
    for _ in range(3):
        check(scratch.read_box, dumps)  # an instance of a class pickled by value
    assert dumps.calls == 3
    assert function_pickles.fingerprint(scratch.read_box) is None
    scratch.ITEMS = list(range(function_pickles.BUDGET))  # too many objects to look at
    assert function_pickles.fingerprint(scratch.read_items) is None


def test_many_functions_keep_a_bounded_number_of_pickles() -> None:
    function_pickles.forget()
    made = []
    for i in range(function_pickles.KEPT + 20):
        made.append(eval(f"lambda: {i}"))
        function_pickles.pickled(made[-1], protocol.dumps)
    assert len(function_pickles._kept) <= function_pickles.KEPT
    function_pickles.forget()


def test_pack_function_uses_the_kept_pickle_and_pack_call_stays_byte_identical(
        scratch: types.ModuleType) -> None:
    assert pack_function(scratch.read_k).blob is pack_function(scratch.read_k).blob
    scratch.K = 7
    assert pack_function(scratch.read_k).blob == fresh(scratch.read_k)
    # Plain arguments take the C pickler: the same bytes cloudpickle makes.
    for args, kwargs in (((1, "a", b"b", 2.5, None, True), {"k": (1, [2], {"x": 3})}),
                         ((), {})):
        pending = PendingFunction(scratch.read_k, args, kwargs)
        packed = pack_call(pending, copy=False)
        expected = cloudpickle.dumps((pack_function(scratch.read_k), args, kwargs), protocol=5)
        assert packed.payload == expected and packed.buffers == ()
    # Anything else goes through cloudpickle as before (a lambda, a buffer out of band).
    lam = PendingFunction(scratch.read_k, (lambda: 3,), {})
    _, args, _ = pickle.loads(pack_call(lam, copy=False).payload)
    assert args[0]() == 3
    big = pickle.PickleBuffer(bytearray(1 << 20))
    packed = pack_call(PendingFunction(scratch.read_k, (big,), {}), copy=True)
    assert len(packed.payload) < 4096 and len(packed.buffers) == 1


def test_the_fingerprint_reads_what_this_cloudpickle_pickles(scratch: types.ModuleType) -> None:
    """A cloudpickle that pickled more of a function would need a fingerprint of it too."""
    from cloudpickle import cloudpickle as cp

    state, slots = cp._function_getstate(scratch.with_default)
    assert set(slots) == {"__name__", "__qualname__", "__annotations__", "__kwdefaults__",
                          "__defaults__", "__module__", "__doc__", "__closure__",
                          "_cloudpickle_submodules", "__globals__"}
    assert state == scratch.with_default.__dict__
