"""A function's pickle, kept while nothing it is made of can have changed.

cloudpickle pickles a function of the user's own code by value -- its code, defaults, closure,
``__dict__``, the globals it names and, in turn, the functions those are -- and did so for every
call: 60-100 µs, the client's largest cost in a round trip. ``pickled`` keeps each function's
bytes with a *fingerprint*: every object cloudpickle reads to pickle it, collected the way
cloudpickle collects them (``_Fingerprint``), each held strongly so that an identity is never
reused. A later call gets the kept bytes only when a fresh fingerprint is the same objects, one
for one (``is``), in the same order: a global rebound, a closure cell set, a default replaced,
a list or dict it names changed in place, a module registered to be pickled by value -- each
changes the fingerprint, and the function is pickled again.

Only what can be read back cheaply and exactly is fingerprinted: ``None``, numbers, strings,
bytes, code objects, tuples, frozensets, lists, sets and dicts of those (their items are read
every time), type hints such as ``list[int]`` and ``A | None``, modules, built-in functions and
functions or classes that pickle by reference (by their names), and functions that pickle by
value built of such. Anything else -- an instance, an array, a class pickled by value (its
namespace may change in any way) -- or more than ``BUDGET`` objects, and the function is
pickled on every call, as before.

One input is not an object the function refers to: cloudpickle also names the submodules of
the packages it uses that are imported at the time (``_find_imported_submodules``), so that the
node imports them too (by name). Scanning ``sys.modules`` for them costs what pickling does,
so for a function that uses a package they are looked for again only when the number of
imported modules changed: one module dropped from ``sys.modules`` while another is imported,
between two calls, would go unseen, and the node would then not import the new one ahead.
And a change that another thread makes while the function is being pickled, and undoes before
it is fingerprinted again, is not seen (it is checked before and after).
"""

from __future__ import annotations

import operator
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from cloudpickle import cloudpickle as _cp

#: Objects fingerprinted per function at most; a function needing more is pickled every call.
BUDGET = 512
#: Functions whose pickles are kept (the oldest is dropped first).
KEPT = 256


class _Marker:
    """A place in a fingerprint that holds no object of the function's."""

    __slots__ = ()


#: A closure cell that was never set (cloudpickle pickles it as such).
_EMPTY = _Marker()
#: A global the function names but its module does not define (yet).
_MISSING = _Marker()
#: Closes a container's items (so two sequences of objects cannot read alike).
_END = _Marker()
#: Classes cloudpickle pickles as constants, though no module holds them by name.
_FIXED_TYPES = (type(None), type(Ellipsis), type(NotImplemented))
#: ``Py_TPFLAGS_HEAPTYPE``: a class made by a ``class`` statement (its names may be changed).
_HEAP_TYPE = 1 << 9
_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes, types.CodeType,
                    type(Ellipsis), type(NotImplemented), _Marker})


class _Uncacheable(Exception):
    """The function's pickle depends on something that cannot be fingerprinted."""


class _Fingerprint:
    """Collects what a pickle depends on (see the module doc). Atoms are appended inline
    (``each``): a fingerprint is taken on every call, and most of it is atoms."""

    __slots__ = ("_seen", "objects", "packages")

    def __init__(self) -> None:
        #: Each object held: its id cannot be reused while the pickle is kept.
        self.objects: list[Any] = []
        #: Whether a package module is among them (then imported submodules matter).
        self.packages = False
        self._seen: set[int] = set()

    def each(self, values: Any) -> None:
        """``add`` every one of ``values``."""
        append, add = self.objects.append, self.add
        for value in values:
            if type(value) in _ATOMS:
                append(value)
            else:
                add(value)

    def add(self, obj: Any) -> None:
        objects = self.objects
        if len(objects) >= BUDGET:
            raise _Uncacheable
        objects.append(obj)
        kind = type(obj)
        if kind in _ATOMS or id(obj) in self._seen:
            return  # an object met before (or a cycle): its identity says it
        self._seen.add(id(obj))
        if kind is tuple or kind is list or kind is frozenset or kind is set:
            self.each(obj)
            objects.append(_END)
        elif kind is dict:
            for key, value in obj.items():
                self.each((key, value))
            objects.append(_END)
        elif kind is types.FunctionType:
            self._function(obj)
        elif kind is types.ModuleType:
            if not _cp._should_pickle_by_reference(obj):
                raise _Uncacheable  # its whole namespace would travel
            objects.append(obj.__name__)
            self.packages = self.packages or bool(getattr(obj, "__package__", None))
        elif isinstance(obj, type):
            if obj in _FIXED_TYPES or obj in _cp._BUILTIN_TYPE_NAMES:
                return  # pickled as cloudpickle's constants (``_class_reduce``)
            if not _cp._should_pickle_by_reference(obj):
                raise _Uncacheable  # pickled by value: its namespace may change in any way
            if obj.__flags__ & _HEAP_TYPE:  # a built-in type's names are fixed (and made anew)
                objects.extend((obj.__module__, obj.__qualname__))
        elif kind is types.GenericAlias or kind is types.UnionType:  # ``list[int]``, ``A | B``
            self.each(obj.__args__)
            if kind is types.GenericAlias:
                self.add(obj.__origin__)
        elif (kind is types.BuiltinFunctionType and isinstance(obj.__self__, types.ModuleType)
              and getattr(obj.__self__, obj.__name__, None) is obj):
            pass  # ``len``, ``math.sqrt``: pickled by name, and its name and module are fixed
        else:
            raise _Uncacheable

    def _function(self, fn: types.FunctionType) -> None:
        """What cloudpickle reads of a function (``_function_getstate``,
        ``_function_getnewargs``), or, pickled by reference, its names."""
        if _cp._should_pickle_by_reference(fn):
            self.objects.extend((True, fn.__module__, fn.__qualname__))
            return
        names = fn.__globals__
        self.each((False, fn.__code__, fn.__name__, fn.__qualname__, fn.__module__, fn.__doc__,
                   fn.__defaults__, fn.__kwdefaults__, fn.__annotations__, fn.__dict__,
                   names.get("__package__", _MISSING), names.get("__name__", _MISSING),
                   names.get("__path__", _MISSING), names.get("__file__", _MISSING)))
        if fn.__closure__:
            self.each(_contents(cell) for cell in fn.__closure__)
        for name in _cp._extract_code_globals(fn.__code__):
            self.each((name, names.get(name, _MISSING)))
        if len(self.objects) > BUDGET:
            raise _Uncacheable


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def fingerprint(fn: Any) -> tuple[tuple[Any, ...], bool] | None:
    """What ``fn``'s pickle depends on and whether a package is among it; None when that
    cannot be told cheaply (see the module doc)."""
    collected = _Fingerprint()
    try:
        collected.add(fn)
    except (_Uncacheable, RecursionError):
        return None
    return tuple(collected.objects), collected.packages


class _Kept:
    """One function's pickle and what it was made of."""

    __slots__ = ("blob", "modules", "objects", "packages", "submodules")

    def __init__(self, blob: bytes, objects: tuple[Any, ...], packages: bool,
                 modules: int, submodules: frozenset[str]) -> None:
        self.blob, self.objects, self.packages = blob, objects, packages
        #: How many modules were imported, and which submodules of its packages, when it
        #: was fingerprinted (see the module doc; a pickle names submodules by name).
        self.modules, self.submodules = modules, submodules

    def still(self, objects: tuple[Any, ...]) -> bool:
        """Whether a pickle made now would be these bytes (``objects``: a fresh fingerprint)."""
        if not _same(self.objects, objects):
            return False
        if self.packages and len(sys.modules) != self.modules:
            modules = len(sys.modules)
            if _imported_submodules(objects) != self.submodules:
                return False
            self.modules = modules
        return True


def _same(kept: tuple[Any, ...], objects: tuple[Any, ...]) -> bool:
    return len(kept) == len(objects) and all(map(operator.is_, kept, objects))


def _imported_submodules(objects: tuple[Any, ...]) -> frozenset[str]:
    """The names of the imported submodules of the package modules among ``objects``."""
    prefixes = tuple(f"{o.__name__}." for o in objects
                     if type(o) is types.ModuleType and getattr(o, "__package__", None))
    if not prefixes:
        return frozenset()
    return frozenset(name for name in list(sys.modules)
                     if isinstance(name, str) and name.startswith(prefixes))


_kept: dict[Any, _Kept] = {}
_lock = threading.Lock()


def pickled(fn: Any, dumps: Callable[[Any], bytes]) -> bytes:
    """``dumps(fn)``, or the bytes it gave last time when nothing ``fn`` is made of changed."""
    objects = fingerprint(fn)
    if objects is None:
        return dumps(fn)
    try:
        kept = _kept.get(fn)
    except TypeError:  # an unhashable callable
        return dumps(fn)
    if kept is not None and kept.still(objects[0]):
        return kept.blob
    modules = len(sys.modules)
    submodules = _imported_submodules(objects[0]) if objects[1] else frozenset()
    blob = dumps(fn)
    # Fingerprinted again after pickling: a change racing the pickle (another thread) leaves
    # them different, and these bytes are not kept.
    after = fingerprint(fn)
    if (after is not None and _same(after[0], objects[0]) and len(sys.modules) == modules
            and (not objects[1] or _imported_submodules(objects[0]) == submodules)):
        with _lock:
            _kept.pop(fn, None)
            while len(_kept) >= KEPT:
                _kept.pop(next(iter(_kept)))
            _kept[fn] = _Kept(blob, objects[0], objects[1], modules, submodules)
    return blob


def forget() -> None:
    """Drop every kept pickle (tests)."""
    with _lock:
        _kept.clear()
