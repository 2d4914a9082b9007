"""A lean HTTP/1.1 client for plain-HTTP (``http://``) servers, on asyncio streams.

A served agent asks its model server once or more per task, and that server is usually on the
same machine or network (vLLM, llama.cpp, Ollama, a stub). Through httpx (its client, httpcore,
h11 and anyio) one such request costs about 0.15 ms of CPU here; this client costs a fifth of
that. It keeps idle connections for reuse, sets TCP_NODELAY, asks for uncompressed answers (and
still decodes gzip or deflate when a server compresses anyway), applies a connect timeout and a
timeout per read, and reads Content-Length, chunked and until-close bodies as a stream.
``https://`` stays with httpx (see ``toolmesh.llm.client``).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import socket
import zlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from types import TracebackType
from typing import TypeVar
from urllib.parse import urlsplit

__all__ = [
    "LeanClient",
    "LeanConnectError",
    "LeanError",
    "LeanProtocolError",
    "LeanResponse",
    "LeanTimeout",
    "lean_suits",
]

T = TypeVar("T")
MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE = 16


class _Default:
    """The type of ``_DEFAULT``: "the client's own setting"."""


_DEFAULT = _Default()


class LeanError(Exception):
    """The exchange with the server failed (no answer, or not a usable one)."""


class LeanConnectError(LeanError):
    pass


class LeanTimeout(LeanError):
    pass


class LeanProtocolError(LeanError):
    pass


class _Unanswered(LeanProtocolError):
    """The server closed the connection before answering (an idle one it had dropped)."""


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @property
    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class LeanClient:
    """Requests to one ``http://`` server, with ``headers`` on every request."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str] | None = None,
        *,
        connect_timeout: float | None = 10.0,
        read_timeout: float | None = 120.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"LeanClient speaks plain http:// only, not {base_url!r}")
        try:
            port = parts.port
        except ValueError as exc:  # a port out of range or not a number
            raise ValueError(f"{base_url!r} is not a usable URL: {exc}") from None
        self._address = (parts.hostname, port or 80)
        host = parts.netloc.rpartition("@")[2]
        fields = {"host": ("Host", host), "accept-encoding": ("Accept-Encoding", "identity")}
        fields.update(_fields(headers))
        self._content_type = fields.pop("content-type", ("", "application/json"))[1]
        self._fields = fields
        self._head_fields = _head_bytes(fields)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []

    async def post(self, url: str, body: bytes, content_type: str | None = None) -> LeanResponse:
        """POST ``body`` to ``url`` (on this client's server); the answer's body is read from
        the returned response (``aread``, ``aiter_lines``), which must be closed."""
        return await self.request("POST", url, body, content_type=content_type)

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        *,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | _Default | None = _DEFAULT,
    ) -> LeanResponse:
        """``method`` ``url`` with ``body`` (none for GET), plus ``headers`` for this request
        only; ``read_timeout`` overrides the client's for this answer (None: wait as long as
        it takes, e.g. for an event stream)."""
        fields = self._head_fields
        if headers:  # this request's own fields replace the client's of the same name
            own = _fields(headers)
            content_type = content_type or own.pop("content-type", ("", ""))[1] or None
            fields = _head_bytes({**self._fields, **own})
        line = f"{method} {_target(url)} HTTP/1.1\r\n"
        if body or method not in ("GET", "HEAD"):
            line += (
                f"Content-Type: {content_type or self._content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
            )
        head = line.encode("latin-1") + fields + b"\r\n"
        timeout = self.read_timeout if isinstance(read_timeout, _Default) else read_timeout
        for attempt in (0, 1):
            connection, reused = await self._connect()
            try:
                connection.writer.write(head + body)
                status, answer, length, chunked, keep_alive = await _read_head(
                    connection.reader, timeout
                )
            except (LeanProtocolError, OSError) as exc:
                connection.close()
                # Only a connection the server had closed is tried again: an answer that
                # came but is unusable means the server may have acted on the request.
                if reused and attempt == 0 and isinstance(exc, _Unanswered | OSError):
                    continue  # the server closed an idle connection; one fresh try
                if isinstance(exc, LeanError):
                    raise
                raise LeanError(f"the exchange failed: {exc}") from exc
            except BaseException:
                connection.close()
                raise
            return LeanResponse(
                self, connection, status, answer, length, chunked, keep_alive, timeout
            )
        raise LeanError("unreachable")  # pragma: no cover

    async def _connect(self) -> tuple[_Connection, bool]:
        idle = self._idle
        while idle:
            connection = idle.pop()
            if connection.usable:
                return connection, True
            connection.close()
        host, port = self._address
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD_BYTES)
        except TimeoutError:
            raise LeanTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise LeanConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer), False

    def _release(self, connection: _Connection) -> None:
        if connection.usable and len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


class LeanResponse:
    """An answer whose body is read as it is consumed; the connection goes back to the pool once
    the body was read whole (and the server keeps it open)."""

    def __init__(
        self,
        client: LeanClient,
        connection: _Connection,
        status: int,
        headers: dict[str, str],
        length: int | None,
        chunked: bool,
        keep_alive: bool,
        read_timeout: float | None,
    ) -> None:
        self.status_code = status
        self.headers = headers  # names in lower case
        self._client = client
        self._connection: _Connection | None = connection
        self._length = length
        self._chunked = chunked
        self._keep_alive = keep_alive
        self._done = False
        self._read_timeout = read_timeout
        coding = headers.get("content-encoding", "identity").strip().lower()
        self._decoder = _decoder(coding)

    async def aread(self) -> bytes:
        """The whole body."""
        connection = self._connection
        if (
            connection is not None
            and not self._done
            and self._length
            and not self._chunked  # chunked framing wins over a Content-Length (RFC 9112 6.3)
            and not self._decoder
        ):
            # A body of known length is read at once, under one timeout.
            reading = connection.reader.readexactly(self._length)
            body = await _read(reading, self._read_timeout)
            self._done = True
            return body
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None or self._done:
            return
        chunks = self._chunks(connection.reader)
        timeout = self._read_timeout
        while True:
            try:
                chunk = await _read(anext(chunks), timeout)  # per read, as httpx's read timeout
            except StopAsyncIteration:
                break
            if chunk:
                yield chunk
        self._done = True
        if self._decoder is not None:
            rest = self._decoder.flush()
            if rest:
                yield rest

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines (CR LF, LF or CR ended), decoded as UTF-8, without line ends."""
        text = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        async for chunk in self.aiter_bytes():
            pending += text.decode(chunk)
            held = pending.endswith("\r")  # its LF may start the next chunk
            whole = pending[:-1] if held else pending
            *lines, pending = whole.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            pending += "\r" if held else ""
            for line in lines:
                yield line
        pending += text.decode(b"", final=True)
        if pending.rstrip("\r"):
            yield pending.rstrip("\r")

    async def _chunks(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        decode = self._decoder.decompress if self._decoder is not None else None
        if self._chunked:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers
                    return
                data = await reader.readexactly(size)
                await reader.readexactly(2)
                yield decode(data) if decode else data
        elif self._length is not None:
            left = self._length
            while left:
                data = await reader.read(min(left, 65536))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                yield decode(data) if decode else data
        else:
            while data := await reader.read(65536):
                yield decode(data) if decode else data

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._done and self._keep_alive:
            self._client._release(connection)
        else:
            connection.close()

    async def __aenter__(self) -> LeanResponse:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _read(step: Awaitable[T], timeout: float | None) -> T:
    """One read of an answer under ``timeout``, its failures as ``LeanError``s."""
    try:
        async with asyncio.timeout(timeout):
            return await step
    except TimeoutError:
        raise LeanTimeout("the server stopped sending") from None
    except asyncio.IncompleteReadError:
        raise LeanProtocolError("the connection closed before the answer was complete") from None
    except (OSError, ValueError, asyncio.LimitOverrunError, zlib.error) as exc:
        raise LeanError(f"reading the answer failed: {exc}") from exc


def lean_suits(url: str) -> bool:
    """Whether the lean client can carry requests to ``url`` as httpx would: plain http://,
    no credentials in the URL, and no HTTP proxy configured for its host (httpx honours
    ``HTTP_PROXY``/``NO_PROXY``; this client connects directly)."""
    import urllib.request  # only here: it is slow to import and rarely needed

    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or "@" in parts.netloc:
        return False
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get("http") or proxies.get("all")):
        return True
    return bool(urllib.request.proxy_bypass(parts.hostname))


def _fields(headers: Mapping[str, str] | None) -> dict[str, tuple[str, str]]:
    """Header fields by lower-case name; names keep the case they were given in (some servers
    care). Content-Length is the client's to set."""
    fields: dict[str, tuple[str, str]] = {}
    for name, value in (headers or {}).items():
        if any(c in name + value for c in "\r\n\0") or not name or ":" in name:
            raise ValueError(f"header {name!r} has a name or value HTTP cannot carry")
        fields[name.lower()] = (name, value)
    fields.pop("content-length", None)
    return fields


def _head_bytes(fields: Mapping[str, tuple[str, str]]) -> bytes:
    return b"".join(f"{name}: {value}\r\n".encode("latin-1") for name, value in fields.values())


def _target(url: str) -> str:
    """The request target (path and query) of an http:// URL, or a path given as is."""
    if url.startswith("/"):
        return url
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _decoder(coding: str) -> zlib._Decompress | None:
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if coding == "deflate":
        return zlib.decompressobj()
    return None


async def _read_head(
    reader: asyncio.StreamReader, timeout: float | None
) -> tuple[int, dict[str, str], int | None, bool, bool]:
    """The final answer's head: interim 1xx answers (100 Continue, 103 Early Hints) that a
    server may send first are skipped (RFC 9110 15.2)."""
    while True:
        head = _parse_head(await _read_raw_head(reader, timeout))
        if not 100 <= head[0] < 200 or head[0] == 101:
            return head


async def _read_raw_head(reader: asyncio.StreamReader, timeout: float | None) -> bytes:
    try:
        async with asyncio.timeout(timeout):
            return await reader.readuntil(b"\r\n\r\n")
    except TimeoutError:
        raise LeanTimeout("the server did not answer in time") from None
    except asyncio.IncompleteReadError:
        raise _Unanswered("the server closed the connection without answering") from None
    except asyncio.LimitOverrunError:
        raise LeanProtocolError("the answer's head is too long") from None


def _parse_head(raw: bytes) -> tuple[int, dict[str, str], int | None, bool, bool]:
    status_line, *header_lines = raw[:-4].split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise LeanProtocolError(f"not an HTTP answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    length: int | None = None
    chunked = False
    keep_alive = parts[0] == b"HTTP/1.1"
    for line in header_lines:
        name, _, value = line.partition(b":")
        key = name.strip().lower().decode("latin-1")
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if key == "content-length" and text.isdigit():
            if length is not None and length != int(text):  # which one frames the body?
                raise LeanProtocolError(f"the answer has conflicting lengths: {headers[key]}")
            length = int(text)
        elif key == "transfer-encoding" and "chunked" in text.lower():
            chunked = True
        elif key == "connection":
            lowered = text.lower()
            keep_alive = "keep-alive" in lowered or (keep_alive and "close" not in lowered)
    status = int(parts[1])
    if status in (204, 304):
        length, chunked = 0, False
    if length is None and not chunked:
        keep_alive = False  # the body ends when the connection does
    return status, headers, length, chunked, keep_alive
