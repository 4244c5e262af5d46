"""The base of every object a user builds (``Spec``, ``Nodes``, ``Image``, ``Options``, ...):
a bad value is a ``sky.ConfigError`` naming each problem, and the first fields may be given
positionally, as the reference's dataclasses take them (``sky.Nodes(4)``,
``sky.Spec(sky.Local())``).

Numbers are numbers: a field that takes an int or a float refuses a string (``ttl="10"``) and
a bool (``nodes=True``), whatever pydantic's lax mode would make of them, and says what it
takes. Every numeric field behaves the same, so a string read from the environment and passed
on unconverted is caught where it is passed, not half the time. An int is accepted where a
float is (``vcpus=4``), and a whole float where an int is (``ttl=sky.time.minutes(10)``).
Text sources (stack config, command-line flags) convert their values before building a model.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, ClassVar, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from skyward_iac.api.errors import ConfigError


def describe_validation_error(what: str, exc: ValidationError) -> str:
    """Render a pydantic error as ``Invalid Spec: nodes: must be at least 1`` lines."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or what
        message = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"  {where}: {message}")
    return f"Invalid {what}:\n" + "\n".join(lines)


class _UserModelType(type(BaseModel)):  # type: ignore[misc]  # pydantic's ModelMetaclass
    """Building a model by calling its class (``sky.Nodes(4)``) maps positional arguments and
    turns a ``ValidationError`` into a ``ConfigError``. Pydantic's own validation of nested
    models does not go through here, so nested problems keep their full location
    (``image.python``) in the one error of the outer model."""

    def __call__(cls, *args: Any, **data: Any) -> Any:
        name = cls.__name__
        positional: tuple[str, ...] = getattr(cls, "positional", ())
        if len(args) > len(positional):
            raise ConfigError(f"{name} takes at most {len(positional)} positional "
                              f"argument(s) ({', '.join(positional) or 'none'}), got {len(args)}")
        for field, value in zip(positional, args, strict=False):
            if field in data:
                raise ConfigError(f"{name} got {field} both positionally and by name")
            data[field] = value
        try:
            return super().__call__(**data)
        except ValidationError as exc:
            error = ConfigError(describe_validation_error(name, exc))
            error.validation = exc  # type: ignore[attr-defined]  # for callers that re-word it
            raise error from None


def _alternatives(annotation: Any) -> list[Any]:
    """The types a field annotation admits (``int | None`` -> ``[int, NoneType]``)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [alt for arg in typing.get_args(annotation) for alt in _alternatives(arg)]
    return [annotation]


def numeric_refusal(annotation: Any, value: Any) -> str | None:
    """Why ``value`` does not fit a field of type ``annotation`` that takes numbers (a string
    or a bool where an int or float is meant), or None when this rule has nothing to say."""
    if not isinstance(value, (str, bool)):
        return None
    admitted = _alternatives(annotation)
    words = set()
    for kind in admitted:
        if kind is float:
            words.add("a number (int or float)")
        elif kind is int and float not in admitted:
            words.add("an int")
    if not words or bool in admitted or (isinstance(value, str) and str in admitted):
        return None
    literals = [v for kind in admitted if typing.get_origin(kind) is Literal
                for v in typing.get_args(kind)]
    if value in literals:
        return None
    accepted = " or ".join(sorted(words) + [repr(v) for v in literals])
    if type(None) in admitted:
        accepted += " or None"
    if isinstance(value, bool):
        return f"must be {accepted}, not the bool {value}"
    try:
        number = float(value)
        hint = f"; write {number:g} without quotes" if math.isfinite(number) else ""
    except ValueError:
        hint = ""
    return f"must be {accepted}, not the string {value!r}{hint}"


class UserModel(BaseModel, metaclass=_UserModelType):
    """A frozen pydantic model whose construction errors are ``ConfigError``s."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)
    #: The fields that may be given positionally, in order.
    positional: ClassVar[tuple[str, ...]] = ()

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, (str, bool)) and info.field_name is not None:
            field = cls.model_fields[info.field_name]
            if (why := numeric_refusal(field.annotation, value)) is not None:
                raise ValueError(why)
        return value


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], /, **fields: Any) -> M:
    """Build ``model`` from ``fields``, raising one ``ConfigError`` that lists every problem."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(model.__name__, exc)) from None


def shown(value: Any) -> str:
    """A refused value as a message shows it: ``the string '2'``, ``2.0 (a float)``."""
    if isinstance(value, str):
        return f"the string {value!r}"
    return f"{value!r:.60} (a {type(value).__name__})"
