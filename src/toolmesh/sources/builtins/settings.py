"""Settings of the built-in tools, read from code (dicts) and toolmesh.toml tables alike.

Each tool keeps its settings in a frozen dataclass with safe defaults. ``load`` builds one from a
mapping and refuses unknown keys and wrong types with the key's name, so a typo in toolmesh.toml
is an error rather than a silently ignored limit.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from toolmesh.errors import ConfigError

__all__ = ["load"]

T = TypeVar("T")


def load(cls: type[T], data: Mapping[str, Any] | None, where: str) -> T:
    """An instance of dataclass ``cls`` from ``data`` (missing keys keep their defaults)."""
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: settings must be a table, not {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            known = ", ".join(sorted(n for n in fields if not n.startswith("_")))
            raise ConfigError(f"{where}: unknown setting {key!r} (known: {known})")
        values[key] = _coerce(value, hints[key], f"{where}.{key}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against a simple type hint; lists become tuples."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        errors: list[str] = []
        for option in typing.get_args(hint):
            try:
                return _coerce(value, option, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: {value!r} does not fit ({_describe(hint)})")
    if origin is typing.Literal:
        if value in typing.get_args(hint):
            return value
        choices = ", ".join(repr(a) for a in typing.get_args(hint))
        raise ConfigError(f"{where}: {value!r} is not one of {choices}")
    if hint is type(None):
        if value is None:
            return None
        raise ConfigError(f"{where}: expected nothing")
    if origin in (tuple, list) or hint in (tuple, list):
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, not {type(value).__name__}")
        args = typing.get_args(hint)
        item = args[0] if args else Any
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, not {type(value).__name__}")
        key_hint, value_hint = typing.get_args(hint) or (Any, Any)
        return {
            _coerce(k, key_hint, where): _coerce(v, value_hint, f"{where}.{k}")
            for k, v in value.items()
        }
    if hint is Any:
        return value
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected a whole number, not a boolean")
    if isinstance(hint, type) and not isinstance(value, hint):
        raise ConfigError(f"{where}: expected {hint.__name__}, not {type(value).__name__}")
    return value


def _describe(hint: Any) -> str:
    return str(hint).replace("typing.", "")
