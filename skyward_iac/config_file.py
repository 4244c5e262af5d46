"""Named pools from ``skyward.toml`` and ``~/.skyward/defaults.toml``: ``Compute(name="train")``.

::

    # skyward.toml (found in the working directory or the nearest parent that has one)
    [pools.train]
    provider = "aws"                       # or a table: { kind = "aws", region = "us-east-1" }
    accelerator = "A100"                   # a string is accepted here only; "H100:8" sets a
                                           # count; or { name = "A100", count = 2, memory = "40GB" }
    nodes = 4                              # or [2, 8] (elastic), or { desired = 8, min = 4 }
    allocation = "spot"
    image = { pip = ["torch"], env = { HF_HOME = "/data/hf" } }

Every ``Spec`` field may appear. ``defaults.toml`` (in ``$SKYWARD_HOME``, else ``~/.skyward``)
has the same shape; a pool defined in both takes each key from the project file when it has it
and from the defaults otherwise (whole values: an ``image`` table is not merged key by key).
Every error names the file, the key and what is allowed.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from skyward_iac.api import accelerators
from skyward_iac.api.accelerators import Accelerator
from skyward_iac.api.errors import ConfigError
from skyward_iac.api.providers import AWS, GCP, PROVIDER_CLASSES, Local
from skyward_iac.api.spec import Spec

PROJECT_FILE = "skyward.toml"
DEFAULTS_FILE = "defaults.toml"
PROVIDERS = PROVIDER_CLASSES  # each provider spec class by its kind (api/providers.py)
ACCELERATOR_KEYS = ("name", "count", "memory", "form_factor")


def find_project_file(start: Path | None = None) -> Path | None:
    """``skyward.toml`` in ``start`` (the working directory) or its nearest parent with one."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / PROJECT_FILE
        if candidate.is_file():
            return candidate
    return None


def defaults_file() -> Path:
    """``$SKYWARD_HOME/defaults.toml``, else ``~/.skyward/defaults.toml`` (may not exist)."""
    home = os.environ.get("SKYWARD_HOME")
    return (Path(home) if home else Path.home() / ".skyward").expanduser() / DEFAULTS_FILE


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of a pool with the file it came from."""

    value: Any
    file: Path


def read_pools(path: Path) -> dict[str, dict[str, Any]]:
    """The ``[pools.NAME]`` tables of one file, checked for shape (not yet for values)."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from None
    if unknown := sorted(set(data) - {"pools", "state", "policy"}):
        raise ConfigError(f"{path}: unknown top-level key {unknown[0]!r}; allowed: pools "
                          "(define pools as [pools.NAME] tables), state, policy")
    pools = data.get("pools", {})
    if not isinstance(pools, dict):
        raise ConfigError(f"{path}: pools must be a table of [pools.NAME] tables, "
                          f"got {pools!r}")
    for name, table in pools.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: pools.{name} must be a table ([pools.{name}]) of "
                              f"Spec fields, got {table!r}")
    return pools


#: Keys of the ``[state]`` table: where the team's stacks live, how their secrets are kept, and
#: whether the backend must hold a team policy (``team_policy = "required"``).
STATE_KEYS = ("backend", "secrets_provider", "team_policy")


def state_setting(key: str, *, cwd: Path | None = None) -> str | None:
    """``[state] key`` from skyward.toml (else defaults.toml), or None when neither sets it."""
    assert key in STATE_KEYS
    for path in (find_project_file(cwd), defaults_file()):
        if path is None or not path.is_file():
            continue
        try:
            with path.open("rb") as handle:
                table = tomllib.load(handle).get("state", {})
        except (tomllib.TOMLDecodeError, OSError) as exc:
            raise ConfigError(f"{path}: cannot be read: {exc}") from None
        if not isinstance(table, dict) or set(table) - set(STATE_KEYS):
            raise ConfigError(f"{path}: [state] takes {', '.join(STATE_KEYS)}, got "
                              f"{table!r}")
        if (value := table.get(key)) is not None:
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{path}: state.{key} must be a non-empty string, "
                                  f"got {value!r}")
            return value
    return None


def pool_settings(name: str, *, cwd: Path | None = None) -> dict[str, Setting]:
    """The merged keys of pool ``name`` (defaults < project), each with its source file."""
    sources = [p for p in (defaults_file(), find_project_file(cwd)) if p and p.is_file()]
    merged: dict[str, Setting] = {}
    defined: dict[str, Path] = {}
    for path in sources:
        pools = read_pools(path)
        for pool in pools:
            defined[pool] = path
        for key, value in pools.get(name, {}).items():
            merged[key] = Setting(value, path)
    if name not in defined:
        searched = f"{PROJECT_FILE} (in {(cwd or Path.cwd()).resolve()} and its parents) " \
                   f"and {defaults_file()}"
        if not defined:
            raise ConfigError(f"no pool named {name!r}: no [pools.*] found in {searched}; "
                              f"add a [pools.{name}] table to {PROJECT_FILE}")
        raise ConfigError(f"no pool named {name!r} in {searched}; defined pools: "
                          f"{', '.join(sorted(defined))}")
    return merged


def pool_names(*, cwd: Path | None = None) -> list[str]:
    """Every pool name defined in the defaults and project files."""
    names: set[str] = set()
    for path in (defaults_file(), find_project_file(cwd)):
        if path is not None and path.is_file():
            names.update(read_pools(path))
    return sorted(names)


def load_pool(name: str, *, cwd: Path | None = None) -> Spec:
    """The ``Spec`` of pool ``name`` from skyward.toml / defaults.toml; ``ConfigError`` if not."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a pool name must be a non-empty string, got {name!r}")
    settings = pool_settings(name, cwd=cwd)
    allowed = list(Spec.model_fields)
    fields: dict[str, Any] = {}
    problems: list[str] = []  # every problem of the pool, reported at once
    for key, setting in settings.items():
        where = f"{setting.file}: pools.{name}.{key}"
        if key not in allowed:
            hint = _close(key, allowed)
            problems.append(f"{where}: unknown key{hint}; allowed: {', '.join(allowed)}")
            continue
        try:
            fields[key] = _convert(key, setting.value, where)
        except ConfigError as exc:
            problems.append(str(exc))
    if "provider" not in settings:
        files = sorted({str(s.file) for s in settings.values()}) or ["(no file)"]
        problems.append(f"{', '.join(files)}: pools.{name}.provider is missing; allowed: "
                        f"{', '.join(repr(k) for k in PROVIDERS)} or a table with kind = ...")
    try:
        # Without a usable provider, the other fields are still checked (against Local).
        spec = Spec.model_validate({"provider": Local(), **fields})
    except ValidationError as exc:
        stand_in = "provider" not in fields  # whole-Spec rules would judge Local, not the pool's
        problems.extend(line for error, line in zip(exc.errors(), _describe(exc, name, settings)
                                                     .splitlines(), strict=True)
                        if error["loc"] or not stand_in)
    if problems:
        raise ConfigError("\n".join(problems))
    return spec


def _convert(key: str, value: Any, where: str) -> Any:
    if key == "provider":
        return _provider(value, where)
    if key == "accelerator":
        return _accelerator(value, where)
    if key == "nodes":
        if isinstance(value, list) and len(value) == 2:
            # TOML has no tuples; [low, high] means what (low, high) means in Python.
            return tuple(value)
        if isinstance(value, bool) or not isinstance(value, int | dict):
            raise ConfigError(f"{where}: must be a count (4), [low, high] ([2, 8]) or a table "
                              f"{{ desired = 8, min = 4, max = 16 }}, got {value!r}")
    return value


def _provider(value: Any, where: str) -> Local | AWS | GCP:
    allowed = ", ".join(repr(k) for k in PROVIDERS)
    options: dict[str, Any] = {}
    if isinstance(value, dict):
        options = dict(value)
        kind = options.pop("kind", None)
        if kind is None:
            raise ConfigError(f"{where}: a provider table needs kind = one of {allowed}")
    else:
        kind = value
    if not isinstance(kind, str) or kind.lower() not in PROVIDERS:
        raise ConfigError(f"{where}: unknown provider {kind!r}; allowed: {allowed}")
    cls = PROVIDERS[kind.lower()]
    known = [f for f in cls.model_fields if f != "kind"]
    for option in options:
        if option not in known:
            listed = ", ".join(known) or "none (it has no options)"
            raise ConfigError(f"{where}.{option}: unknown option for provider {kind!r}"
                              f"{_close(option, known)}; allowed: {listed}")
    try:
        return cls.model_validate(options)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_problems(exc)}") from None


def _accelerator(value: Any, where: str) -> Accelerator:
    if isinstance(value, str):
        name, _, count = value.partition(":")
        options: dict[str, Any] = {}
        if count:
            try:
                options["count"] = float(count) if "." in count else int(count)
            except ValueError:
                raise ConfigError(f"{where}: {value!r}: the count after ':' must be a number, "
                                  f"as in 'H100:8'") from None
    elif isinstance(value, dict):
        options = dict(value)
        name = options.pop("name", None)
        for option in options:
            if option not in ACCELERATOR_KEYS:
                raise ConfigError(f"{where}.{option}: unknown accelerator option; allowed: "
                                  f"{', '.join(ACCELERATOR_KEYS)}")
        if not isinstance(name, str):
            raise ConfigError(f"{where}: an accelerator table needs name = such as 'A100'")
    else:
        raise ConfigError(f"{where}: must be an accelerator name such as 'A100', 'H100:8' or a "
                          f"table {{ name = 'A100', count = 2 }}, got {value!r}")
    factory_name = _known_name(name.strip())
    if factory_name is None:
        raise ConfigError(f"{where}: unknown accelerator {name!r}"
                          f"{_close(name, list(accelerators.KNOWN))}; allowed: "
                          f"{', '.join(accelerators.KNOWN)}")
    factory = getattr(accelerators, factory_name)
    try:
        return factory(**options)  # type: ignore[no-any-return]
    except ConfigError as exc:
        if (validation := getattr(exc, "validation", None)) is not None:
            raise ConfigError(f"{where}: {_problems(validation)}") from None
        raise ConfigError(f"{where}: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_problems(exc)}") from None


def _known_name(name: str) -> str | None:
    if name in accelerators.KNOWN:
        return name
    return next((k for k in accelerators.KNOWN if k.lower() == name.lower()), None)


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def _close(word: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _describe(exc: ValidationError, name: str, settings: Mapping[str, Setting]) -> str:
    lines = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        setting = settings.get(loc[0]) if loc else None
        file = setting.file if setting else next(iter(settings.values())).file
        # TOML has arrays, not tuples: say what to write in the file.
        message = str(error["msg"]).removeprefix("Value error, ").replace("a valid tuple",
                                                                          "an array")
        lines.append(f"{file}: pools.{name}.{'.'.join(loc)}: {message}")
    return "\n".join(lines)
