"""Property keys a provider accepts, and the way back.

Anthropic refuses a tool whose schema has a property key outside ``[A-Za-z0-9_.-]{1,64}`` (and
with it the whole request); Gemini wants parameter names like identifiers. OpenAPI operations
bring keys such as ``$top``, ``filter[name]`` or ``X-Request-ID``. The provider forms use legal
keys; ``restore_keys`` maps the keys of a call's arguments back to the tool's own, from the
tool's schema, so nothing has to be remembered between the two.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["ANTHROPIC_KEY", "GEMINI_KEY", "legal_keys", "restore_keys"]

ANTHROPIC_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
GEMINI_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_RULES = (ANTHROPIC_KEY, GEMINI_KEY)

_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")


def _legal(key: str, rule: re.Pattern[str]) -> str:
    if rule.fullmatch(key):
        return key
    allowed = "A-Za-z0-9_.-" if rule is ANTHROPIC_KEY else "A-Za-z0-9_"
    clean = re.sub(f"[^{allowed}]", "_", key)[:64] or "_"
    if rule is GEMINI_KEY and not (clean[0].isalpha() or clean[0] == "_"):
        clean = ("_" + clean)[:64]
    return clean


def key_map(keys: list[str], rule: re.Pattern[str]) -> dict[str, str]:
    """Each key's legal form under ``rule``; distinct keys stay distinct (``_2``, ``_3``...)."""
    taken = {key for key in keys if rule.fullmatch(key)}
    out: dict[str, str] = {}
    for key in keys:
        legal = _legal(key, rule)
        if legal != key:
            base, n = legal[:60], 2
            while legal in taken:
                legal, n = f"{base}_{n}", n + 1
            taken.add(legal)
        out[key] = legal
    return out


def legal_keys(schema: Any, rule: re.Pattern[str]) -> Any:
    """``schema`` with every property key legal under ``rule`` (``required`` and Gemini's
    ``property_ordering`` follow); the same object when nothing needed renaming."""
    return _walk(schema, rule) if _needs(schema, rule) else schema


def _needs(node: Any, rule: re.Pattern[str]) -> bool:
    if isinstance(node, list):
        return any(_needs(item, rule) for item in node)
    if not isinstance(node, Mapping):
        return False
    properties = node.get("properties")
    if isinstance(properties, Mapping) and any(not rule.fullmatch(k) for k in properties):
        return True
    return any(_needs(value, rule) for value in node.values() if isinstance(value, Mapping | list))


def _walk(node: Any, rule: re.Pattern[str]) -> Any:
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, Mapping):
            renamed = key_map(list(value), rule)
            out[key] = {renamed[k]: _walk(v, rule) for k, v in value.items()}
        elif key in _MAPS and isinstance(value, Mapping):
            out[key] = {k: _walk(v, rule) for k, v in value.items()}
        elif key in _ONE:
            out[key] = _walk(value, rule)
        elif key in _MANY and isinstance(value, list):
            out[key] = [_walk(v, rule) for v in value]
        else:
            out[key] = value
    if renamed:
        for key in ("required", "property_ordering"):
            if isinstance(out.get(key), list):
                out[key] = [renamed.get(k, k) if isinstance(k, str) else k for k in out[key]]
    return out


def restore_keys(
    arguments: dict[str, Any],
    properties: Mapping[str, Any],
    descend: Callable[[Any, Any], Any],
    rules: Sequence[re.Pattern[str]] = _RULES,
) -> dict[str, Any]:
    """``arguments`` with keys a provider form renamed given back their own names (``descend``
    handles each value with its property's schema). ``rules``: the key rules of the forms the
    arguments may come from; keys renamed by one rule can mean other keys under another."""
    if all(key in properties for key in arguments):
        return {key: descend(value, properties[key]) for key, value in arguments.items()}
    names = list(properties)
    back: dict[str, str] = {}
    for rule in rules:
        for original, legal in key_map(names, rule).items():
            if legal != original and legal not in properties:
                back.setdefault(legal, original)
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        own = key if key in properties else back.get(key, key)
        out[own] = descend(value, properties.get(own))
    return out
