"""Capability tags and who holds them (seed 003).

A tag is ``namespace::operation`` with any number of ``::`` segments. Holding a tag grants it and
everything beneath it, by whole segments: ``math`` grants ``math::add`` and ``math::x::y``;
``math::add`` grants only ``math::add`` (not ``math``, not ``math::addition``). A tool that
requires no tags is always available; otherwise every tag it requires must be granted.

The host's set comes from its manifest. Under the ``locked`` policy (the default) a session gets
exactly that set and asking for anything else is refused; under ``extensible`` a session may
``inherit`` it, ``extend`` it (union) or ``replace`` it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from toolmesh.errors import CapabilityError, ConfigError

__all__ = [
    "ALL",
    "CapabilityPolicy",
    "CapabilitySet",
    "check_tag",
    "satisfies",
    "session_capabilities",
    "string_list",
]

CapabilityPolicy = Literal["locked", "extensible"]

ALL = "*"
"""The wildcard tag: holds every capability. An unconfigured host holds it."""

_SEGMENT = re.compile(r"[A-Za-z0-9_.\-]+")


def check_tag(tag: str, *, where: str = "capability") -> str:
    """Return ``tag`` if it is well formed (non-empty segments joined by ``::``), else raise."""
    if tag == ALL:
        return tag
    segments = tag.split("::")
    if not all(_SEGMENT.fullmatch(s) for s in segments):
        raise ConfigError(
            f"{where} {tag!r} is not a capability tag: use segments of letters, digits, "
            "'_', '.', '-' joined by '::' (e.g. 'fs::read')"
        )
    return tag


def string_list(value: str | Iterable[str], *, where: str, paths: bool = False) -> list[str]:
    """The strings given to a parameter that takes several (tags, capabilities, name patterns,
    origins, with ``paths`` folders too): the public API's one rule is that a lone str is one
    item, never the sequence of its characters. With ``paths`` an ``os.PathLike`` is taken as
    its text. Anything else is a ConfigError naming ``where``."""
    given: Any = value
    if isinstance(given, str) or (paths and isinstance(given, os.PathLike)):
        given = [given]
    try:
        items: list[Any] | None = list(given)
    except TypeError:
        items = None
    if paths and items:
        items = [os.fspath(item) if isinstance(item, os.PathLike) else item for item in items]
    if items is None or not all(isinstance(item, str) for item in items):
        raise ConfigError(f"{where} must be a string or a list of strings, not {value!r}")
    return items


def satisfies(held: Iterable[str], required: str) -> bool:
    """Whether holding ``held`` grants the single tag ``required`` (whole-segment prefix)."""
    for tag in held:
        if tag in (ALL, required):
            return True
        if required.startswith(tag) and required[len(tag) : len(tag) + 2] == "::":
            return True
    return False


class CapabilitySet:
    """An immutable set of held tags with a memo of the answers it has given."""

    __slots__ = ("_grants", "tags")

    def __init__(self, tags: str | Iterable[str] = (ALL,)) -> None:
        held = string_list(tags, where="capabilities")
        self.tags: frozenset[str] = frozenset(check_tag(t) for t in held)
        self._grants: dict[str, bool] = {}

    @property
    def unrestricted(self) -> bool:
        return ALL in self.tags

    def grants(self, required: str) -> bool:
        answer = self._grants.get(required)
        if answer is None:
            answer = self._grants[required] = satisfies(self.tags, required)
        return answer

    def missing(self, required: Sequence[str]) -> str | None:
        """The first required tag this set does not grant, or None when all are granted."""
        for tag in required:
            if not self.grants(tag):
                return tag
        return None

    def allows(self, required: Sequence[str]) -> bool:
        return self.missing(required) is None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CapabilitySet) and other.tags == self.tags

    def __hash__(self) -> int:
        return hash(self.tags)

    def __repr__(self) -> str:
        return f"CapabilitySet({sorted(self.tags)!r})"


def session_capabilities(
    host: CapabilitySet,
    policy: CapabilityPolicy,
    strategy: str = "inherit",
    requested: Iterable[str] = (),
) -> CapabilitySet:
    """The set a session holds: the host's set adjusted as the policy allows."""
    requested = [check_tag(t, where="requested capability") for t in requested]
    if strategy == "inherit" and not requested:
        return host
    if strategy not in ("inherit", "extend", "replace"):
        raise CapabilityError(
            f"unknown capability strategy {strategy!r}; use inherit, extend or replace"
        )
    if policy == "locked":
        raise CapabilityError(
            f"this host's capabilities are locked; a session cannot {strategy} them "
            "(the host must be configured with capability_policy='extensible')"
        )
    if strategy == "inherit":
        raise CapabilityError("strategy 'inherit' takes no capabilities; use 'extend' or 'replace'")
    if strategy == "extend":
        return CapabilitySet(host.tags | set(requested))
    return CapabilitySet(requested)
