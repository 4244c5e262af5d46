"""The base of every object a user builds (``Spec``, ``Nodes``, ``Image``, ``Options``, ...):
a bad value is a ``sky.ConfigError`` naming each problem, and the first fields may be given
positionally, as the reference's dataclasses take them (``sky.Nodes(4)``,
``sky.Spec(sky.Local())``)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

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


class UserModel(BaseModel, metaclass=_UserModelType):
    """A frozen pydantic model whose construction errors are ``ConfigError``s."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)
    #: The fields that may be given positionally, in order.
    positional: ClassVar[tuple[str, ...]] = ()
