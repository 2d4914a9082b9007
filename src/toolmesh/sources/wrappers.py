"""Behaviours as wrappers around a source: filtered, prefixed, renamed, re-tagged.

Each wrapper delegates everything to the source it wraps and changes one thing, so they compose:
``Prefixed(Filtered(mcp, deny=["delete_*"]), "gh")``. The wrapped tool keeps its executor: a
renamed tool still runs under the name its source knows it by. Each wraps whatever
``Toolkit.add`` takes: a source, a toolkit, a plugin, a tool, an ``@tool`` function or a list.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from toolmesh.capabilities import check_tag, string_list
from toolmesh.errors import ConfigError
from toolmesh.sources.base import Source, SourceStatus
from toolmesh.tools import Tool

if TYPE_CHECKING:
    from toolmesh.toolkit import SourceLike

__all__ = ["Filtered", "Prefixed", "Renamed", "Tagged", "WrapperSource"]


class WrapperSource(Source):
    """Delegates everything to ``wrapped``; subclasses override ``keep`` and/or ``map``."""

    def __init__(self, wrapped: SourceLike | Sequence[SourceLike]) -> None:
        self.wrapped = _as_source(wrapped, type(self).__name__)
        self.name = self.wrapped.name
        # The inner tools the cache was made from, held (not their ids: a freed tool's id is
        # soon another tool's, and a source that re-lists its tools frees the old ones).
        self._cache_key: tuple[Tool, ...] | None = None
        self._mapped: list[Tool | None] = []  # per tool of the key: what it became (None: left out)
        self._cache_settings: object = None
        self._cache: list[Tool] = []
        self.wrapped.subscribe(lambda _source: self.changed())

    @property
    def status(self) -> SourceStatus:
        return self.wrapped.status

    @status.setter
    def status(self, value: SourceStatus) -> None:
        self.wrapped.status = value

    def tools(self) -> Sequence[Tool]:
        inner = tuple(self.wrapped.tools())
        if not _same_tools(inner, self._cache_key):
            # A tool the source still lists as the same object keeps its mapped one: a change
            # to a few tools stays a change to those few for the toolkit and its index. Which
            # tools are kept is asked again of every tool (a filter may have changed since).
            settings = self.settings()
            before: dict[int, Tool | None] = {}
            if settings == self._cache_settings:  # (else renamed or retagged: all made anew)
                before = dict(zip(map(id, self._cache_key or ()), self._mapped, strict=True))
            self._cache_settings = settings
            self._mapped = [self._mapped_copy(t, before.get(id(t))) for t in inner]
            self._cache = [t for t in self._mapped if t is not None]
            self._cache_key = inner
        return self._cache

    def _mapped_copy(self, tool: Tool, known: Tool | None) -> Tool | None:
        if not self.keep(tool):
            return None
        return known if known is not None else self.map(tool)

    def keep(self, tool: Tool) -> bool:
        return True

    def settings(self) -> object:
        """What ``map`` depends on besides the tool, to notice it changed."""
        return None

    def map(self, tool: Tool) -> Tool:
        return tool

    async def open(self) -> None:
        await self.wrapped.open()

    async def close(self) -> None:
        await self.wrapped.close()

    def search(self, query: str, filter_tags: Sequence[str] = ()) -> list[str] | None:
        ranked = self.wrapped.search(query, filter_tags)
        if ranked is None:
            return None
        by_inner = {t.name: t for t in self.wrapped.tools()}
        out = []
        for name in ranked:
            tool = by_inner.get(name)
            if tool is not None and self.keep(tool):
                out.append(self.map(tool).name)
        return out


class Filtered(WrapperSource):
    """Keeps tools whose names match ``allow`` (glob patterns; all when empty) and not ``deny``,
    and that pass ``predicate``."""

    def __init__(
        self,
        wrapped: SourceLike | Sequence[SourceLike],
        *,
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
        predicate: Callable[[Tool], bool] | None = None,
    ) -> None:
        self.allow = string_list(allow, where="Filtered allow")
        self.deny = string_list(deny, where="Filtered deny")
        self.predicate = predicate
        super().__init__(wrapped)

    def keep(self, tool: Tool) -> bool:
        name = tool.name
        if self.allow and not any(fnmatch.fnmatchcase(name, p) for p in self.allow):
            return False
        if any(fnmatch.fnmatchcase(name, p) for p in self.deny):
            return False
        return self.predicate is None or self.predicate(tool)


class Prefixed(WrapperSource):
    """Names every tool ``{prefix}{separator}{name}``."""

    def __init__(
        self, wrapped: SourceLike | Sequence[SourceLike], prefix: str, *, separator: str = "_"
    ) -> None:
        self.prefix = prefix
        self.separator = separator
        super().__init__(wrapped)

    def map(self, tool: Tool) -> Tool:
        return tool.replace(name=f"{self.prefix}{self.separator}{tool.name}")

    def settings(self) -> object:
        return self.prefix, self.separator


class Renamed(WrapperSource):
    """Renames tools by an old -> new mapping; others keep their names."""

    def __init__(
        self, wrapped: SourceLike | Sequence[SourceLike], names: Mapping[str, str]
    ) -> None:
        self.names = dict(names)
        super().__init__(wrapped)

    def map(self, tool: Tool) -> Tool:
        new = self.names.get(tool.name)
        return tool if new is None else tool.replace(name=new)

    def settings(self) -> object:
        return dict(self.names)


class Tagged(WrapperSource):
    """Adds capability requirements and/or classification tags to every tool."""

    def __init__(
        self,
        wrapped: SourceLike | Sequence[SourceLike],
        *,
        capabilities: Sequence[str] = (),
        tags: Sequence[str] = (),
    ) -> None:
        self.capabilities = [
            check_tag(c) for c in string_list(capabilities, where="Tagged capabilities")
        ]
        self.tags = string_list(tags, where="Tagged tags")
        super().__init__(wrapped)

    def map(self, tool: Tool) -> Tool:
        definition = tool.definition
        return tool.replace(
            capabilities=_union(definition.capabilities, self.capabilities),
            tags=_union(definition.tags, self.tags),
        )

    def settings(self) -> object:
        return list(self.capabilities), list(self.tags)


def _as_source(item: SourceLike | Sequence[SourceLike], wrapper: str) -> Source:
    """``item`` as the source ``Toolkit.add`` would make of it (a refusal names the wrapper)."""
    if isinstance(item, Source):
        return item
    from toolmesh.toolkit import as_source  # the toolkit module imports this one

    try:
        return as_source(item)
    except ConfigError as exc:
        raise ConfigError(str(exc), location=wrapper) from None


def _same_tools(now: tuple[Tool, ...], before: tuple[Tool, ...] | None) -> bool:
    return (
        before is not None
        and len(now) == len(before)
        and all(a is b for a, b in zip(now, before, strict=True))
    )


def _union(first: Sequence[str], second: Sequence[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))
