"""The A2E ToolPlugin contract (seed 000) and the source that serves a plugin's tools.

A plugin implements ``_list_tools()`` and ``_execute_tool(tool_name, arguments) -> dict``;
``_search_tools`` may be overridden for custom ranking. ``_execute_tool`` is blocking code, so it
runs on a worker thread; ``emit`` from inside it reaches the right call even when several calls
run at once (the call is tracked per thread context, not in the plugin-wide callback).

A thread the plugin starts itself (``threading.Thread``, a ``ThreadPoolExecutor``) inherits no
context, so its ``emit`` cannot tell whose it is: it goes to the plugin's running call when
there is exactly one, and when several run, only to the plugin-wide callback (logged at debug
level). Such a thread reaches its own call whatever runs beside it when it is started in the
call's context: ``Thread(target=contextvars.copy_context().run, args=(work,))``, one copy per
thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from toolmesh.errors import ConfigError
from toolmesh.models import ToolDefinition, ToolEvent, ToolResult, check_event_data
from toolmesh.sources.base import Source
from toolmesh.tools import Tool, ToolContext, check_tool_event_kind, run_blocking

__all__ = ["PluginSource", "ToolPlugin"]

logger = logging.getLogger("toolmesh.plugin")

# A call being run: its context and the event loop it belongs to.
_Call = tuple[ToolContext, asyncio.AbstractEventLoop]

# The call being run, per thread context.
_current_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "toolmesh_plugin_call", default=None
)

# Each plugin's calls whose _execute_tool runs now, by id (of the plugin: it need not be
# hashable; of the context), for an emit from a thread that has no call in its context.
_running: dict[int, dict[int, _Call]] = {}
_running_lock = threading.Lock()


class ToolPlugin(ABC):
    """Base class for A2E tool plugins: the seed's contract, method for method."""

    name: str = "base_tool"

    def __init__(self, host_instance: Any = None, config: Any = None) -> None:
        self.host = host_instance
        self.config = config
        self._event_cb: Callable[[ToolEvent], None] | None = None

    @abstractmethod
    def _list_tools(self) -> list[ToolDefinition]:
        """Must return the tool manifest."""

    @abstractmethod
    def _execute_tool(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run one tool; return a JSON-serializable dict, raise for failure."""

    def _search_tools(
        self,
        query: str,
        filter_tags: list[str] | None = None,
        tools: list[ToolDefinition] | None = None,
    ) -> list[ToolDefinition]:
        """On-demand discovery: tools ranked by relevance to ``query`` across name (split on
        ``_ . -`` and camelCase), description, tags and parameter names and descriptions.
        Override for another strategy."""
        candidates = self._list_tools() if tools is None else tools
        wanted = set(filter_tags or ())
        candidates = [t for t in candidates if wanted.issubset(t.tags)]
        from toolmesh.search import SearchIndex  # imported by the first search only

        index = SearchIndex()
        for definition in candidates:
            index.add(definition.name, definition)
        by_name = {t.name: t for t in candidates}
        return [by_name[name] for name, _score in index.search(query)]

    def set_event_callback(self, fn: Callable[[ToolEvent], None]) -> None:
        """Register a callback that also receives every emitted event: the very event the
        call records (same ``seq`` and data), in order. During a call it runs on the event
        loop's thread, right after the event is recorded."""
        self._event_cb = fn

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Emit a streaming event during ``_execute_tool``. From a thread the plugin started,
        it reaches the call only when the plugin runs just one (see the module's docstring)."""
        # A bad event fails in the tool, on its own thread: checked and encoded here, not in
        # the callback on the loop that records it, where a ValueError would reach nobody.
        check_tool_event_kind(kind)
        current = _current_call.get() or _sole_running_call(self)
        if current is None:
            payload = dict(data or {})
            check_event_data(kind, payload)
            if self._event_cb is not None:
                self._event_cb(ToolEvent(kind=kind, data=payload))
            return
        ctx, loop = current
        prepared = ctx._prepare(kind, data)
        if _on_loop(loop):
            self._record(ctx, kind, prepared)
        else:
            # The event is recorded on the loop's thread; the callback must follow it there
            # (reading ctx.events from here would see the previous event, or none).
            with contextlib.suppress(RuntimeError):  # the loop is gone: the call is over
                loop.call_soon_threadsafe(self._record, ctx, kind, prepared)

    def _record(
        self, ctx: ToolContext, kind: str, prepared: tuple[dict[str, Any], int, bool]
    ) -> None:
        """On the loop's thread: record the event, then hand that same event to the callback."""
        before = ctx._emitted
        ctx._append(kind, *prepared)
        event = ctx._last_event
        if self._event_cb is None or event is None or ctx._emitted <= before:
            return  # no callback, or the call is over and the event was dropped
        try:
            self._event_cb(event)
        except Exception:
            logger.exception("plugin %s: the event callback failed", self.name)


class PluginSource(Source):
    """Serves a ToolPlugin's tools; re-read them with ``refresh()``."""

    def __init__(self, plugin: ToolPlugin) -> None:
        if not isinstance(plugin, ToolPlugin):
            raise ConfigError(f"{plugin!r} is not a ToolPlugin")
        self.plugin = plugin
        self.name = f"plugin:{plugin.name}"
        self._custom_search = type(plugin)._search_tools is not ToolPlugin._search_tools
        self._tools: list[Tool] = []
        self.refresh(notify=False)

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def refresh(self, *, notify: bool = True) -> None:
        definitions = self.plugin._list_tools()
        toolkit = self.plugin.name
        self._tools = [
            Tool(
                d if d.toolkit else d.model_copy(update={"toolkit": toolkit}),
                self._runner(d.name),
                source="plugin",
            )
            for d in definitions
        ]
        if notify:
            self.changed()

    def search(self, query: str, filter_tags: Sequence[str] = ()) -> list[str] | None:
        """The plugin's own ranking, when it has one. A ``_search_tools`` that raises or
        returns anything but ToolDefinitions is logged and ignored: the toolkit ranks this
        source's tools itself (None), so listing keeps working."""
        if not self._custom_search:
            return None
        try:
            found: Any = self.plugin._search_tools(query, list(filter_tags) or None, None)
            if isinstance(found, str | bytes | dict):
                raise TypeError(f"returned {type(found).__name__}, not a list")
            found = list(found)
            wrong = next((d for d in found if not isinstance(d, ToolDefinition)), None)
            if wrong is not None:
                raise TypeError(f"returned {wrong!r} instead of a ToolDefinition"[:200])
        except Exception as exc:
            logger.warning(
                "plugin %s: _search_tools(%r) failed (%s: %s); using toolmesh's own ranking",
                self.plugin.name,
                query,
                type(exc).__name__,
                exc,
            )
            return None
        return [d.name for d in found]

    def _runner(self, tool_name: str) -> Callable[[dict[str, Any], ToolContext], Any]:
        plugin = self.plugin
        is_async = inspect.iscoroutinefunction(plugin._execute_tool)

        def execute(
            arguments: dict[str, Any], ctx: ToolContext, loop: asyncio.AbstractEventLoop
        ) -> Any:
            # Counted as running here, on its thread: until _execute_tool returns, also
            # past the call's deadline, when the threads it started may still emit.
            _current_call.set((ctx, loop))
            with _running_call(plugin, (ctx, loop)):
                return plugin._execute_tool(tool_name, arguments)

        async def run(arguments: dict[str, Any], ctx: ToolContext) -> Any:
            loop = asyncio.get_running_loop()
            if is_async:
                token = _current_call.set((ctx, loop))
                try:
                    with _running_call(plugin, (ctx, loop)):
                        raw = await plugin._execute_tool(tool_name, arguments)  # type: ignore[misc]
                finally:
                    _current_call.reset(token)
            else:
                raw = await run_blocking(execute, arguments, ctx, loop)
            return _plugin_result(tool_name, raw)

        return run


@contextlib.contextmanager
def _running_call(plugin: ToolPlugin, call: _Call) -> Iterator[None]:
    """``call`` counted among ``plugin``'s running calls while the block runs."""
    with _running_lock:
        _running.setdefault(id(plugin), {})[id(call[0])] = call
    try:
        yield
    finally:
        with _running_lock:
            calls = _running[id(plugin)]
            del calls[id(call[0])]
            if not calls:
                del _running[id(plugin)]


def _sole_running_call(plugin: ToolPlugin) -> _Call | None:
    """The call an emit with no call in its context belongs to: ``plugin``'s only running
    call; None when it runs none, or several (which one is then unknowable)."""
    with _running_lock:
        calls = list(_running.get(id(plugin), {}).values())
    if len(calls) == 1:
        return calls[0]
    if calls:
        logger.debug(
            "plugin %s: an emit from outside any call's context while %d calls run goes "
            "only to the plugin-wide callback",
            plugin.name,
            len(calls),
        )
    return None


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _plugin_result(tool_name: str, raw: Any) -> Any:
    """A dict shaped like a ToolResult is taken as one (the A2E SDK's habit); any other value
    is the result's data."""
    if isinstance(raw, dict) and {"success", "tool_name", "duration_ms"} <= raw.keys():
        return ToolResult.model_validate(raw)
    return raw
