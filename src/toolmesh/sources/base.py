"""The Source interface: anything that yields tools and runs them.

A source may need to connect first (``open``), may fail or be switched off (``status``), may
change its tool list at run time (it calls ``changed()`` and the toolkit re-reads ``tools()``),
and may rank searches over its own tools its own way (``search``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from toolmesh.tools import Tool

__all__ = ["Source", "SourceStatus", "ToolSet"]

SourceState = Literal["connected", "failed", "disabled", "pending"]


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Whether a source is serving tools, and if not, why."""

    state: SourceState = "connected"
    reason: str = ""


class Source(ABC):
    """Yields tools and runs them. Subclasses implement ``tools()``; the rest is optional."""

    name: str = "source"
    _status: SourceStatus = SourceStatus()

    @property
    def status(self) -> SourceStatus:
        """Whether the source serves tools now (connected / failed / disabled / pending)."""
        return self._status

    @status.setter
    def status(self, value: SourceStatus) -> None:
        self._status = value

    @abstractmethod
    def tools(self) -> Sequence[Tool]:
        """The tools this source serves now."""

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Connect or load; a failure should set ``status`` rather than raise."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``open`` acquired (processes, connections)."""

    def search(self, query: str, filter_tags: Sequence[str] = ()) -> list[str] | None:
        """Names of this source's tools ranked for ``query``, or None to use the toolkit's
        own index (the default)."""
        return None

    def subscribe(self, callback: Callable[[Source], None]) -> None:
        """Call ``callback(self)`` whenever the tool list changes."""
        listeners: list[Callable[[Source], None]] = self.__dict__.setdefault("_listeners", [])
        listeners.append(callback)

    def unsubscribe(self, callback: Callable[[Source], None]) -> None:
        """Stop calling ``callback`` (once, as it was subscribed once); none such: nothing."""
        listeners: list[Callable[[Source], None]] = self.__dict__.get("_listeners", [])
        if callback in listeners:
            listeners.remove(callback)

    def changed(self) -> None:
        """Tell subscribers that ``tools()`` now answers differently. One that raises (a
        toolkit refusing a name clash) does not keep the others from hearing of it: the first
        error is raised once they all have."""
        failure: Exception | None = None
        for callback in list(self.__dict__.get("_listeners", ())):
            try:
                callback(self)
            except Exception as exc:
                failure = exc if failure is None else failure
        if failure is not None:
            raise failure


class ToolSet(Source):
    """A fixed list of tools, such as functions registered by hand."""

    def __init__(self, tools: Sequence[Tool] = (), *, name: str = "tools") -> None:
        self.name = name
        self._tools: list[Tool] = list(tools)

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def add(self, *tools: Tool) -> None:
        self._tools.extend(tools)
        self.changed()

    def remove(self, name: str) -> bool:
        before = len(self._tools)
        self._tools = [t for t in self._tools if t.name != name]
        if len(self._tools) != before:
            self.changed()
            return True
        return False
