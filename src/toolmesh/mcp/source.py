"""An MCP server as a toolmesh source: its tools become governed toolmesh tools.

The connection lives in its own task (the SDK's client is built on anyio task groups, which
must be entered and left by one task), so ``open`` and ``close`` may come from anywhere. Calls
run in the pipeline's task and go through the SDK's session:

- the pipeline's deadline (or the caller's cancellation) cancels the request at the server: the
  SDK sends ``notifications/cancelled`` (over HTTP, a 2026-07-28 connection closes the request's
  stream instead, and a 2025-era one closes it once the notice is out); a server that never
  answers its POST holds up later calls no longer than ``ACK_TIMEOUT`` (or the connect timeout,
  if shorter);
- progress notifications become ``progress`` events and, when configured, restart the
  deadline up to ``max_total_timeout``;
- a stdio server that dies fails its running calls with a clear error (the last lines it wrote
  to stderr included) and is started again by the next call;
- ``notifications/tools/list_changed`` (or a 2026-07-28 ``subscriptions/listen`` event)
  re-reads the tool list, and the toolkit re-assembles.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from toolmesh.errors import ArgumentError, SchemaError
from toolmesh.mcp.config import MCPServerConfig
from toolmesh.mcp.definitions import definition_from_mcp, input_schema_of, usable_tool_entries
from toolmesh.mcp.results import result_from_mcp
from toolmesh.models import ToolErrorCode, ToolResult
from toolmesh.schema import Validator, compile_validator, ref_cycle, validates_as_2020_12
from toolmesh.sources.base import Source, SourceStatus
from toolmesh.sources.wrappers import Filtered, Prefixed, Tagged
from toolmesh.tools import Tool, ToolContext

if TYPE_CHECKING:
    from mcp import Client, MCPError

__all__ = ["MCPSource", "mcp_source"]

logger = logging.getLogger("toolmesh.mcp")

MAX_PAGES = 1000  # a server whose cursors never end cannot hang a listing
STDERR_LINES = 20
MAX_PROBLEMS_SHOWN = 5
MAX_STRAY_LINES_LOGGED = 5  # per connection, at WARNING; the rest at DEBUG
# How long an HTTP server may take to answer a message owed only a status (a notification's
# 202, which needs no work): the connect timeout, but no more, as every later message of the
# connection waits meanwhile (see _http_client).
ACK_TIMEOUT = 10.0
_NOTICE_WRITE_TIMEOUT = 5.0  # a notifications/cancelled written in the background, as the SDK's
_CONNECTION_CLOSED = -32000
# A malformed answer, handed to the SDK as an error for the request it answers
_MALFORMED_ANSWER = -32603
_PARSE_ERROR = -32700  # the SDK's, for an answer over HTTP it could not read
_MALFORMED_MARK = "toolmesh: malformed answer"


def mcp_source(config: MCPServerConfig, *, wrap: bool = True) -> Source:
    """The source for one configured server: its tools filtered, re-tagged and prefixed.

    ``wrap=False`` leaves allow/deny and capabilities to the caller (the manifest loader)."""
    source: Source = MCPSource(config)
    if wrap and (config.allow or config.deny):
        source = Filtered(source, allow=config.allow, deny=config.deny)
    capabilities = config.capabilities if wrap else ()
    if capabilities or config.tags:
        source = Tagged(source, capabilities=capabilities, tags=config.tags)
    if config.tool_prefix:
        source = Prefixed(source, config.tool_prefix)
    return source


class MCPSource(Source):
    """The tools of one MCP server, over stdio or streamable HTTP."""

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.name = config.name
        self._tools: list[Tool] = []
        self._connection: _Connection | None = None
        self._connecting: asyncio.Future[_Connection] | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._refresh_again = False
        self._closed = False
        self.server_info: dict[str, Any] = {}
        self.protocol_version = ""
        self.status = (
            SourceStatus("pending")
            if config.enabled
            else SourceStatus("disabled", "disabled in the configuration")
        )

    def tools(self) -> Sequence[Tool]:
        return self._tools

    @property
    def closed(self) -> bool:
        return self._closed

    # -- lifecycle -------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect and list the tools; a failure or a hang sets ``status``, never raises."""
        if not self.config.enabled or self._connection is not None or self._closed:
            return
        try:
            await self._connect()
        except _ConnectFailed:
            return
        except asyncio.CancelledError:
            # The caller gave up: stop connecting too, or the server would go on starting
            # (and stay connected) behind it, with nobody left to close it.
            pending = self._connecting
            if pending is not None and not pending.done():
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            raise

    async def close(self) -> None:
        """Disconnect; a stdio server's process (and its children) is gone when this returns,
        also when it was still connecting."""
        self._closed = True
        refreshing, self._refreshing = self._refreshing, None
        if refreshing is not None:
            refreshing.cancel()
        pending = self._connecting
        if pending is not None and not pending.done():
            pending.cancel()
            self.status = SourceStatus("failed", f"MCP server {self.name!r} was closed")
        else:
            pending = None
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.stop()
        ending = [task for task in (pending, refreshing) if task is not None]
        if ending:  # the connection being made is stopped (its process reaped) by now
            await asyncio.gather(*ending, return_exceptions=True)

    async def _connect(self) -> _Connection:
        """The live connection, connecting first (once, however many calls wait for it)."""
        if self._connection is not None and self._connection.alive:
            return self._connection
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._start_connection())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if connecting.cancelled() and (task is None or not task.cancelling()):
                # Not this caller's cancellation: close() (or a cancelled open) stopped it.
                raise _ConnectFailed(f"MCP server {self.name!r} was closed") from None
            raise

    async def _start_connection(self) -> _Connection:
        if self._closed:
            raise _ConnectFailed(f"MCP server {self.name!r} is closed")
        stale, self._connection = self._connection, None
        if stale is not None:
            await stale.stop()
        connection = _Connection(self.config, self._on_change, self._on_lost)
        try:
            listing = await connection.start()
        except Exception as exc:
            reason = _connect_failure(
                self.config, exc, connection.stderr_tail(), connection.refusal()
            )
            self.status = SourceStatus("failed", reason)
            logger.warning("MCP server %r: %s", self.name, reason)
            raise _ConnectFailed(reason) from None
        if self.closed:  # closed while connecting
            await connection.stop()
            raise _ConnectFailed(f"MCP server {self.name!r} is closed")
        self._connection = connection
        self.server_info = connection.server_info
        self.protocol_version = connection.protocol_version
        self._set_tools(listing, connection.listing_problems)
        return connection

    # -- tools -----------------------------------------------------------------------------------

    def _set_tools(self, listing: list[dict[str, Any]], problems: Sequence[str]) -> None:
        listing, duplicates = _without_duplicates(listing)
        problems = [*problems, *duplicates]
        known = {t.name: t for t in self._tools}
        defer = self.config.defers(len(listing))
        tools = []
        for entry in listing:
            previous = known.get(str(entry["name"]))
            made = self._built(entry, defer, problems)
            if made is None:
                continue
            if previous is not None and previous.definition == made.definition:
                made = previous  # unchanged: the toolkit keeps its index entry
            tools.append(made)
        self.status = SourceStatus("connected", _listing_reason(problems))
        if problems:
            logger.warning("MCP server %r: %s", self.name, self.status.reason)
        changed = [id(t) for t in tools] != [id(t) for t in self._tools]
        self._tools = tools
        if changed:
            self.changed()

    def _built(self, entry: dict[str, Any], defer: bool, problems: list[str]) -> Tool | None:
        """The tool of one listed entry, mended as far as needed (what was mended, or why it is
        left out, goes into ``problems``): one entry never costs the server its other tools,
        at the first listing or at a refresh."""
        name = str(entry["name"])
        for key in ("inputSchema", "outputSchema"):
            schema = entry.get(key)
            cycle = ref_cycle(schema) if isinstance(schema, dict) else None
            if cycle is not None:
                # No validator ever finishes with it, so it is dropped as any bad field is (an
                # input schema becomes the empty object one: the server checks its arguments).
                problems.append(
                    f"tool {name!r}: ignored {key} ($ref {cycle!r} leads back to itself "
                    "without reaching a schema)"
                )
                entry = {k: v for k, v in entry.items() if k != key}
        try:
            return self._tool(entry, defer)
        except Exception as exc:  # an entry of a shape nothing above foresaw
            problems.append(f"tool {name!r}: left out ({type(exc).__name__}: {exc})")
            return None

    def _tool(self, entry: dict[str, Any], defer: bool) -> Tool:
        name = str(entry["name"])
        definition = definition_from_mcp(entry, server=self.name, defer_loading=defer)
        schema = input_schema_of(entry)
        try:
            tool = Tool(
                definition,
                self._caller(name),
                source="mcp",
                input_schema=schema,
                cancels_promptly=True,
            )
        except SchemaError:  # parameters cannot be derived: list and validate the schema as is
            exact = definition.model_copy(update={"input_schema": schema})
            tool = Tool(exact, self._caller(name), source="mcp", cancels_promptly=True)
        try:
            compile_validator(schema)
        except Exception:
            # A schema our validator cannot compile: the server validates its own arguments.
            tool._validator = Validator({"type": "object"})
        return tool

    def _caller(self, remote_name: str) -> Callable[[dict[str, Any], ToolContext], Any]:
        # The tools cancel promptly (the SDK's courtesy cancel is handed on without waiting,
        # see _WatchedWrite), so the pipeline runs a call in the caller's task: the SDK's anyio
        # cancel scopes are entered and left by that one task. A partial: no frame of its own.
        return functools.partial(self._call, remote_name)

    async def _call(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        connection = self._connection
        if connection is None or not connection.alive:
            try:
                connection = await self._connect()
            except _ConnectFailed as exc:
                message = f"MCP server {self.name!r} is not available: {exc}"
                return _failure(ctx.tool_name, message)
        progress = _ProgressRelay(ctx, self.config)
        try:
            result = await connection.client.call_tool(name, arguments, progress_callback=progress)
        except _mcp_error() as exc:
            fault = _malformed_fault(exc)
            if fault is not None:
                return _failure(
                    ctx.tool_name, f"MCP server {self.name!r} sent a malformed answer: {fault}"
                )
            if exc.code == _CONNECTION_CLOSED:
                connection.lost()
                if self._closed:
                    return _failure(
                        ctx.tool_name, f"MCP server {self.name!r} was closed during the call"
                    )
                return _failure(ctx.tool_name, _lost_message(self, connection))
            return _failure(
                ctx.tool_name, f"MCP server {self.name!r} answered error {exc.code}: {exc}"
            )
        except ValidationError as exc:  # an answer that is not a CallToolResult
            return _failure(
                ctx.tool_name, f"MCP server {self.name!r} sent a malformed result: {_fields(exc)}"
            )
        except (RuntimeError, ValueError) as exc:  # e.g. content that breaks its outputSchema
            return _failure(ctx.tool_name, f"MCP server {self.name!r}: {exc}")
        return result_from_mcp(result, ctx, tool_name=ctx.tool_name)

    # -- changes ---------------------------------------------------------------------------------

    def _on_change(self) -> None:
        """The server's tool list changed: re-read it (one refresh at a time)."""
        if self._refreshing is not None and not self._refreshing.done():
            self._refresh_again = True
            return
        self._refreshing = asyncio.ensure_future(self._refresh())

    async def _refresh(self) -> None:
        while True:
            self._refresh_again = False
            connection = self._connection
            if connection is None or self._closed:
                return
            try:
                listing = await connection.list_tools()
            except Exception as exc:
                logger.warning("MCP server %r: re-reading the tool list failed: %s", self.name, exc)
                return
            self._set_tools(listing, connection.listing_problems)
            if not self._refresh_again:
                return

    def _on_lost(self, connection: _Connection) -> None:
        if connection is self._connection and not self._closed:
            self.status = SourceStatus("failed", _lost_message(self, connection))


class _ConnectFailed(Exception):
    pass


class _Connection:
    """One live session with the server, owned by its own task."""

    def __init__(
        self,
        config: MCPServerConfig,
        on_change: Callable[[], None],
        on_lost: Callable[[_Connection], None],
    ) -> None:
        self.config = config
        self._on_change = on_change
        self._on_lost = on_lost
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[list[dict[str, Any]]] | None = None
        self._client: Client | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._refusal: Callable[[], str] = str  # the HTTP status a server last refused with
        self._repair = _InboundRepair(config.name, lambda: self.protocol_version)
        self.listing_problems: list[str] = []
        # Per listed tool, the check of its structured content (None: it has no outputSchema)
        self._output_checks: dict[str, Validator | None] = {}
        self._sdk_output_check: Callable[[str, Any], Awaitable[None]] | None = None
        self.alive = False
        self.server_info: dict[str, Any] = {}
        self.protocol_version = ""

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("the MCP connection is closed")
        return self._client

    async def start(self) -> list[dict[str, Any]]:
        """Connect (within the connect timeout) and return the first tool listing."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._task = asyncio.ensure_future(self._run())
        try:
            async with asyncio.timeout(self.config.connect_timeout):
                return await asyncio.shield(self._ready)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Leave the session; the SDK closes stdin, then terminates the process group."""
        self.alive = False
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        if self._ready is not None and not self._ready.done():
            task.cancel()  # still connecting: abandon the handshake
        await asyncio.gather(task, return_exceptions=True)

    def lost(self) -> None:
        """The server went away (its stdout closed, or a call saw the connection close)."""
        if self.alive:
            self.alive = False
            self._stop.set()
            self._on_lost(self)

    def stderr_tail(self) -> str:
        return " | ".join(line for line in self._stderr if line.strip())

    def refusal(self) -> str:
        """The status an HTTP server last refused a request with ("HTTP 401 Unauthorized")."""
        return self._refusal()

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool, following tools/list pagination."""
        client = self.client
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        self._repair.problems = []
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="bypass")
            tools.extend(
                t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools
            )
            cursor = page.next_cursor
            if not cursor or cursor in seen:  # "" ends a listing too: some servers send it
                break
            seen.add(cursor)
        self.listing_problems = self._repair.problems
        self._output_checks = _output_checks(tools)
        return tools

    async def _check_output(self, name: str, result: Any) -> None:
        """Stands in for the SDK's ``validate_tool_result``, with the same contract: a result
        whose structured content breaks the tool's outputSchema raises ``RuntimeError``. The
        SDK's check runs jsonschema (pure Python), a third of what a call through this source
        cost beyond the SDK's own; the compiled validator does it in a small fraction of that.
        Schemas only a JSON Schema 2020-12 validator reads right, and tools this connection did
        not list, are left to the SDK's check."""
        check = self._output_checks.get(name, _SDK_CHECKS)
        if check is None:
            return
        if check is not _SDK_CHECKS:
            content = result.structured_content
            if content is None and "structured_content" not in result.model_fields_set:
                raise RuntimeError(
                    f"Tool {name} has an output schema but did not return structured content"
                )
            try:
                check(content)
                return
            except ArgumentError as exc:
                raise RuntimeError(
                    f"Invalid structured content returned by tool {name}: "
                    f"{exc.reason} at {exc.path}"
                ) from None
            except Exception:  # a schema ours cannot compile: the SDK's check names the fault
                self._output_checks.pop(name, None)
        sdk_check = self._sdk_output_check
        if sdk_check is None:  # pragma: no cover - installed with the client
            return
        try:
            await sdk_check(name, result)
        except RuntimeError as exc:  # jsonschema's report spans lines: its message and path
            cause = exc.__cause__
            message, where = getattr(cause, "message", None), getattr(cause, "json_path", None)
            if isinstance(message, str) and isinstance(where, str):
                raise RuntimeError(
                    f"Invalid structured content returned by tool {name}: {message} at {where}"
                ) from None
            raise

    async def _run(self) -> None:
        from mcp import Client

        ready = self._ready
        assert ready is not None
        try:
            async with (
                self._transport() as transport,
                Client(
                    transport,
                    mode=self.config.mode,
                    message_handler=self._on_message,
                    cache=None,
                ) as client,
            ):
                self._client = client
                session = client.session
                self._sdk_output_check = session.validate_tool_result
                session.validate_tool_result = self._check_output  # type: ignore[method-assign]
                self.protocol_version = client.protocol_version
                info = client.server_info
                self.server_info = info.model_dump(mode="json", exclude_none=True) if info else {}
                listing = await self.list_tools()
                self.alive = True
                if not ready.done():
                    ready.set_result(listing)
                await self._serve(client)
        except BaseException as exc:
            if not ready.done():
                if isinstance(exc, Exception):
                    ready.set_exception(exc)
                else:
                    ready.cancel()
            if not isinstance(exc, Exception):
                raise
            if self.alive:
                logger.warning("MCP server %r: the connection failed: %s", self.config.name, exc)
        finally:
            self._client = None
            self.lost()

    async def _serve(self, client: Client) -> None:
        """Wait for close or loss; on a 2026-07-28 connection, listen for tool-list changes."""
        listener = None
        capabilities = client.server_capabilities.tools
        if capabilities is not None and capabilities.list_changed and _modern(client):
            listener = asyncio.ensure_future(self._listen(client))
        try:
            await self._stop.wait()
        finally:
            if listener is not None:
                listener.cancel()
                await asyncio.gather(listener, return_exceptions=True)

    async def _listen(self, client: Client) -> None:
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    pass  # the notification also reaches _on_message, which refreshes
        except Exception as exc:
            logger.debug("MCP server %r: listen ended: %s", self.config.name, exc)

    async def _on_message(self, message: Any) -> None:
        method = getattr(message, "method", None)
        if method == "notifications/tools/list_changed":
            self._on_change()
        elif isinstance(message, Exception):
            logger.debug("MCP server %r sent a malformed message: %s", self.config.name, message)

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        _quiet_sdk_read_errors()
        if self.config.transport == "http":
            async with self._http() as transport:
                yield transport
            return
        async with self._stdio() as transport:
            yield transport

    @contextlib.asynccontextmanager
    async def _http(self) -> AsyncIterator[Any]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        from toolmesh.mcp._http_client import AckBoundClient

        config = self.config
        client = AckBoundClient(
            config.name,
            min(config.connect_timeout, ACK_TIMEOUT),
            headers=config.http_headers(),
            timeout=httpx2.Timeout(config.connect_timeout, read=None),
        )
        self._refusal = lambda: client.last_refusal
        async with client:
            http = streamable_http_client(self.config.url, http_client=client)
            yield _Watched(http, self.lost, self._repair)

    @contextlib.asynccontextmanager
    async def _stdio(self) -> AsyncIterator[Any]:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=self.config.command,
            args=list(self.config.args),
            env=dict(self.config.env),
            cwd=self.config.cwd,
        )
        read_fd, write_fd = os.pipe()
        errlog = os.fdopen(write_fd, "w")
        reader = asyncio.ensure_future(self._read_stderr(read_fd))
        try:
            stdio = stdio_client(params, errlog=errlog)
            yield _Watched(stdio, self.lost, self._repair, after_enter=errlog.close)
        finally:
            errlog.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(reader)
            reader.cancel()

    async def _read_stderr(self, fd: int) -> None:
        """Keep the last lines the server wrote to stderr (they explain failures)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024)
        pipe = os.fdopen(fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
        name = self.config.name
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # a line longer than the limit
                    continue
                if not line:
                    return
                # masked before it is kept or logged: status reasons and errors quote it
                text = self.config.mask(line.decode("utf-8", "replace").rstrip())
                self._stderr.append(text[:500])
                logger.debug("MCP server %r stderr: %s", name, text)
        finally:
            transport.close()


class _Watched:
    """A transport whose read stream tells ``on_end`` when the server stops sending."""

    def __init__(
        self,
        inner: Any,
        on_end: Callable[[], None],
        repair: _InboundRepair,
        *,
        after_enter: Callable[[], None] | None = None,
    ) -> None:
        self._inner = inner
        self._on_end = on_end
        self._repair = repair
        self._after_enter = after_enter

    async def __aenter__(self) -> tuple[Any, Any]:
        try:
            read_stream, write_stream = await self._inner.__aenter__()
        finally:
            if self._after_enter is not None:
                self._after_enter()  # the child holds its own copy of the stderr pipe now
        read = _WatchedRead(read_stream, self._on_end, self._repair)
        return read, _WatchedWrite(write_stream, self._repair)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._inner.__aexit__(exc_type, exc, tb)
        return result


class _InboundRepair:
    """Mends what the server sends on its way in, where the SDK would lose more than the bad
    part: it rejects a whole ``tools/list`` answer for one malformed tool (and with it every
    tool of the server), and it drops an answer whose envelope is malformed, so the call it
    answers would wait out its deadline."""

    def __init__(self, server: str, version: Callable[[], str]) -> None:
        self._server = server
        self._version = version
        self._pending: set[Any] = set()
        self._stray_lines = 0
        self.problems: list[str] = []

    def sent(self, item: Any) -> None:
        message = getattr(item, "message", None)
        if getattr(message, "method", None) == "tools/list":
            self._pending.add(getattr(message, "id", None))

    def received(self, item: Any) -> Any:
        if isinstance(item, ValidationError):  # a line the SDK could not read as JSON-RPC
            return self._unreadable(item)
        if not self._pending:
            return item  # no listing asked for: every call's answer passes here untouched
        message: Any = getattr(item, "message", None)
        if getattr(message, "method", None) is not None:
            return item  # a request or notification from the server
        request_id = getattr(message, "id", None)
        if request_id not in self._pending:
            return item
        self._pending.discard(request_id)
        result = getattr(message, "result", None)
        if isinstance(result, dict) and isinstance(result.get("tools"), list):
            try:
                tools, problems = usable_tool_entries(result, version=self._version())
                if problems:
                    message.result = {**result, "tools": tools}
            except Exception:  # mending is a courtesy: never lose the connection over it
                logger.exception("MCP: mending a tools/list answer failed")
                return item
            self.problems += problems
        return item

    def _unreadable(self, exc: ValidationError) -> Any:
        """An answer with a usable id becomes an error for the request it answers; anything
        else (a banner, a debug print) is logged and skipped."""
        from mcp.shared.message import SessionMessage
        from mcp_types import ErrorData, JSONRPCError

        answer = _malformed_answer(exc)
        if answer is not None:
            if answer[0] in self._pending:
                self._pending.discard(answer[0])
            error = ErrorData(code=_MALFORMED_ANSWER, message=answer[1], data=_MALFORMED_MARK)
            return SessionMessage(JSONRPCError(jsonrpc="2.0", id=answer[0], error=error))
        self._stray_lines += 1
        if self._stray_lines <= MAX_STRAY_LINES_LOGGED:
            errors = exc.errors(include_url=False)
            shown = repr(errors[0].get("input") if errors else None)
            if len(shown) > 200:
                shown = shown[:200] + "..."
            more = (
                " (further ones are logged at DEBUG level)"
                if self._stray_lines == MAX_STRAY_LINES_LOGGED
                else ""
            )
            logger.warning(
                "MCP server %r wrote a line to stdout that is not JSON-RPC (ignored): %s%s",
                self._server,
                shown,
                more,
            )
        else:
            logger.debug("MCP server %r: another line that is not JSON-RPC", self._server)
        return exc


class _StreamProxy:
    """Delegates to one of the SDK's streams; subclasses watch what passes."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Any:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._inner.__aexit__(exc_type, exc, tb)
        return result


class _WatchedWrite(_StreamProxy):
    """A write stream that notes the ``tools/list`` requests sent, and never holds up a
    cancellation: the SDK's cancel path waits (up to 5 s) until its ``notifications/cancelled``
    is written, and a server that stopped reading would keep a call past its deadline that long.
    Such a notice is handed on at once when the writer is free, else written in the
    background (always over HTTP, whose SDK stream has no ``send_nowait``: a request sent
    next may then reach the server before the notice, which names its own request)."""

    def __init__(self, inner: Any, repair: _InboundRepair) -> None:
        super().__init__(inner)
        self._repair = repair
        self._notices: set[asyncio.Task[None]] = set()

    async def send(self, item: Any) -> None:
        self._repair.sent(item)
        if getattr(getattr(item, "message", None), "method", None) != "notifications/cancelled":
            await self._inner.send(item)
            return
        try:
            self._inner.send_nowait(item)  # the writer was waiting for it
        except Exception:  # busy (WouldBlock), closed, or a stream without send_nowait
            notice = asyncio.ensure_future(self._send_later(item))
            self._notices.add(notice)
            notice.add_done_callback(self._notices.discard)

    async def _send_later(self, item: Any) -> None:
        with contextlib.suppress(Exception):  # closed meanwhile, or still blocked: left unsent
            async with asyncio.timeout(_NOTICE_WRITE_TIMEOUT):
                await self._inner.send(item)

    def _drop_notices(self) -> None:
        for notice in list(self._notices):
            notice.cancel()

    async def aclose(self) -> None:
        self._drop_notices()
        await self._inner.aclose()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._drop_notices()
        return await super().__aexit__(exc_type, exc, tb)


class _WatchedRead(_StreamProxy):
    """A read stream that notices its end and mends tool listings."""

    def __init__(self, inner: Any, on_end: Callable[[], None], repair: _InboundRepair) -> None:
        super().__init__(inner)
        self._on_end = on_end
        self._repair = repair

    async def receive(self) -> Any:
        try:
            return self._repair.received(await self._inner.receive())
        except Exception:
            self._on_end()
            raise

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return self._repair.received(await self._inner.__anext__())
        except Exception:  # StopAsyncIteration too: the server stopped sending
            self._on_end()
            raise


class _ProgressRelay:
    """MCP progress notifications as ``progress`` events (and deadline extensions)."""

    def __init__(self, ctx: ToolContext, config: MCPServerConfig) -> None:
        self.ctx = ctx
        self.started = time.monotonic()
        self.window = (ctx.deadline - self.started) if ctx.deadline is not None else None
        self.limit = (
            self.started + config.max_total_timeout
            if config.max_total_timeout is not None
            else None
        )
        self.extend = config.reset_timeout_on_progress

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        ctx = self.ctx
        data: dict[str, Any] = {
            "pct": _percent(progress, total),
            "message": message or "",
            "progress": progress,
        }
        if total is not None:
            data["total"] = total
        ctx.emit("progress", data)
        if self.extend and self.window is not None:
            ctx.extend_deadline(time.monotonic() + self.window, limit=self.limit)


def _fields(exc: ValidationError, shown: int = 3) -> str:
    """A validation error in one line: the first few fields and what is wrong with them."""
    errors = exc.errors(include_url=False)
    parts = [f"{'.'.join(map(str, e['loc'])) or 'result'}: {e['msg']}" for e in errors[:shown]]
    more = f"; and {len(errors) - shown} more" if len(errors) > shown else ""
    return "; ".join(parts) + more


# The SDK's ERROR records (with tracebacks) of what a server sent that it could not read. Each
# is told better elsewhere: a stray stdout line by the connection's own warning, naming the
# server and the line; a malformed answer by the failed call's error.
_SDK_READ_ERRORS = {
    "mcp.client.stdio": {"Failed to parse JSONRPC message from server"},
    "mcp.client.streamable_http": {"Error parsing JSON response", "Error parsing SSE message"},
}


class _ReadErrorsAtDebug(logging.Filter):
    """Keeps the SDK's records of unreadable server output at DEBUG, without the traceback."""

    def __init__(self, messages: set[str]) -> None:
        super().__init__()
        self._messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in self._messages:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


@functools.cache
def _quiet_sdk_read_errors() -> None:
    for name, messages in _SDK_READ_ERRORS.items():
        logging.getLogger(name).addFilter(_ReadErrorsAtDebug(messages))


_SDK_PARSE_FAILURES = ("Failed to parse JSON response: ", "Failed to parse SSE message: ")


def _malformed_fault(exc: MCPError) -> str | None:
    """What was wrong with a malformed answer that became ``exc`` (ours over stdio, the SDK's
    over HTTP, whose text is a pydantic dump), in one line; None for a server's own error."""
    if exc.code == _MALFORMED_ANSWER and exc.data == _MALFORMED_MARK:
        return exc.message
    if exc.code != _PARSE_ERROR or not exc.message.startswith(_SDK_PARSE_FAILURES):
        return None
    # The dump lists each branch's faults as "Branch.loc" then "  message [type=...]". As over
    # stdio, the answer is judged as an error if it carries one, else as a result.
    faults: dict[str, list[str]] = {"JSONRPCResponse": [], "JSONRPCError": []}
    lines = exc.message.splitlines()
    for place, detail in itertools.pairwise(lines):
        branch, _, loc = place.partition(".")
        if branch in faults and loc and detail.startswith("  "):
            faults[branch].append(f"{loc}: {detail.strip().split(' [')[0]}")
    without_error = "error: Field required" in faults["JSONRPCError"]
    chosen = faults["JSONRPCResponse" if without_error else "JSONRPCError"]
    if not chosen:  # not JSON at all, say: the first detail is what there is
        details = [line.strip().split(" [")[0] for line in lines if line.startswith("  ")]
        return (details[0] if details else lines[0])[:300]
    return "; ".join(chosen[:3])


def _malformed_answer(exc: ValidationError) -> tuple[int | str, str] | None:
    """The request id and the fault of an answer (a JSON object with an id and no method) that
    is not valid JSON-RPC; None for anything else."""
    for error in exc.errors(include_url=False):
        message = error.get("input")
        if isinstance(message, dict):
            break
    else:
        return None  # not even a JSON object
    request_id = message.get("id")
    if "method" in message or isinstance(request_id, bool):
        return None
    if not isinstance(request_id, int | str):
        return None
    # Judged as the kind of answer it tries to be: an error if it carries one, else a result.
    kind = "JSONRPCError" if "error" in message else "JSONRPCResponse"
    faults = [
        f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}"
        for e in exc.errors(include_url=False)
        if e["loc"][:1] == (kind,)
    ]
    return request_id, "; ".join(faults[:3]) or "not a JSON-RPC answer"


def _percent(progress: float, total: float | None) -> int:
    """Progress as a whole percentage in 0..100, whatever numbers the server sends."""
    if not total:
        return 0
    pct = progress / total * 100
    if not math.isfinite(pct):  # e.g. 1e300 of 1e-300: the event still goes out
        return 100 if pct > 0 else 0
    return max(0, min(100, round(pct)))


_SDK_CHECKS: Any = object()  # a tool whose structured content the SDK's own check judges


def _output_checks(listing: Sequence[dict[str, Any]]) -> dict[str, Validator | None]:
    """The check of each listed tool's structured content: its outputSchema compiled on first
    use, ``format`` an annotation only, as the SDK's check has it (None: no outputSchema, or
    one with a $ref cycle, which the tool ignores). Schemas our validator would read otherwise
    than 2020-12 are left out, for the SDK."""
    checks: dict[str, Validator | None] = {}
    for entry in listing:
        schema = entry.get("outputSchema")
        if schema is None or (isinstance(schema, dict) and ref_cycle(schema) is not None):
            checks[str(entry["name"])] = None
        elif isinstance(schema, dict) and validates_as_2020_12(schema):
            checks[str(entry["name"])] = Validator(schema, formats=False)
    return checks


@functools.cache
def _mcp_error() -> type[MCPError]:
    """The SDK's error class (imported once; the SDK loads when a server first connects)."""
    from mcp import MCPError

    return MCPError


def _modern(client: Client) -> bool:
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    return client.protocol_version in MODERN_PROTOCOL_VERSIONS


def _failure(tool_name: str, message: str) -> ToolResult:
    return ToolResult.failure(tool_name, ToolErrorCode.TOOL_ERROR, message)


def _without_duplicates(
    listing: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[str]]:
    """The listing with each name once (the first entry wins), and the names listed twice."""
    unique: dict[str, dict[str, Any]] = {}
    for entry in listing:
        unique.setdefault(str(entry["name"]), entry)
    if len(unique) == len(listing):
        return listing, []
    counts = collections.Counter(str(entry["name"]) for entry in listing)
    twice = [
        f"tool {name!r}: listed {n} times, the first one is kept"
        for name, n in counts.items()
        if n > 1
    ]
    return list(unique.values()), twice


def _listing_reason(problems: Sequence[str]) -> str:
    """The status reason of a server whose listing had malformed entries ("" when none)."""
    if not problems:
        return ""
    shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - MAX_PROBLEMS_SHOWN
    suffix = f"; and {more} more" if more > 0 else ""
    entries = "entry" if len(problems) == 1 else "entries"
    return f"{len(problems)} malformed tool {entries}: {shown}{suffix}"


def _lost_message(source: MCPSource, connection: _Connection) -> str:
    kind = "its process exited" if source.config.transport == "stdio" else "the connection closed"
    message = f"MCP server {source.name!r} went away during the call ({kind})"
    tail = connection.stderr_tail()
    if tail:
        message += f"; its last stderr output: {tail}"
    return message + "; it is restarted on the next call"


def _connect_failure(
    config: MCPServerConfig, exc: BaseException, stderr: str, refusal: str = ""
) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        reason = f"no answer within the connect timeout of {config.connect_timeout:g}s"
    elif isinstance(exc, FileNotFoundError) and config.cwd and not os.path.isdir(config.cwd):
        reason = f"its working folder {config.cwd!r} does not exist"  # not the command's fault
    elif isinstance(exc, FileNotFoundError | PermissionError):
        reason = f"cannot start {config.command!r}: {exc.strerror}"
    else:
        reason = _describe(exc)
    if refusal and refusal not in reason:
        reason = f"{reason}: the server answered {refusal}"
    where = config.describe()
    text = f"{reason} ({config.transport}: {where})"
    if stderr:
        text += f"; stderr: {stderr}"
    return config.mask(text)  # an exception's text may quote a secret too


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, ValidationError):
        return f"the server sent a malformed answer: {_fields(exc)}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
