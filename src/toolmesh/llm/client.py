"""A client for a model provider's HTTP API, and the agent loop it runs (``client.run``).

``create_client(base_url, style="openai" | "anthropic" | "gemini", model=..., api_key=...)``
speaks any of these APIs, over httpx for ``https://`` and a lean HTTP/1.1 client for a model
server on plain ``http://`` (``toolmesh.transports.lean_http``; httpx again when a proxy is
configured for that host); no provider SDK is needed. Requests that fail
with 429 or a 5xx status, or that get no answer, are retried with exponential backoff; a
``Retry-After`` (or ``retry-after-ms``) header sets the wait instead. A retry never waits past
the run's deadline, nor longer than ``max_retry_wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import math
import random
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx
from pydantic_core import to_json

from toolmesh import strictjson
from toolmesh.errors import ConfigError, ProviderError
from toolmesh.llm.styles import ChatMessage, Reply, Style, style_named
from toolmesh.tools import Tool
from toolmesh.transports.bodies import read_at_most
from toolmesh.transports.lean_http import LeanClient, LeanError, LeanResponse, lean_suits
from toolmesh.transports.sse import read_events

if TYPE_CHECKING:
    from toolmesh.llm.loop import RunEvent, RunResult

__all__ = ["RETRY_STATUSES", "LLMClient", "create_client", "retry_delay"]

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_RETRY_AFTER = 3600.0  # the longest one retry waits, whatever the provider asks for
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a model's answer (whole or streamed); past it, refused
_ERROR_BYTES = 64 * 1024  # of a refusal's body, kept to explain it


# What reading a provider's answer raises when it has another shape than documented (a string
# where an object belongs, "many" for a token count): a ProviderError, not a Python error.
_SHAPE_ERRORS = (AttributeError, TypeError, ValueError, KeyError, IndexError)


def create_client(
    base_url: str,
    style: str = "openai",
    model: str = "",
    api_key: str | None = None,
    *,
    system: str = "",
    headers: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    max_retries: int = 3,
    backoff: float = 0.5,
    max_backoff: float = 30.0,
    max_retry_wait: float = 60.0,
    options: Mapping[str, Any] | None = None,
) -> LLMClient:
    """A client for the model ``model`` behind ``base_url`` (e.g. ``https://api.openai.com/v1``,
    ``https://api.anthropic.com/v1`` or ``https://generativelanguage.googleapis.com/v1beta``).

    ``system`` is the default system prompt of every run, ``options`` extra top-level request
    fields (``temperature``, ``max_tokens``, ...; Gemini's go in ``generationConfig``),
    ``timeout`` the limit of one HTTP request.
    ``max_retry_wait`` is the longest ``Retry-After`` waited for: a provider asking for more
    (an exhausted quota says hours) fails the request at once instead of holding the run.
    """
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"base_url must be an http(s) URL, not {base_url!r}")
    if not model:
        raise ConfigError("create_client needs a model name (model=...)")
    if max_retries < 0 or backoff < 0 or max_backoff < 0 or max_retry_wait < 0:
        raise ConfigError(
            "max_retries, backoff, max_backoff and max_retry_wait must not be negative"
        )
    if not (isinstance(timeout, int | float) and 0 < timeout < math.inf):
        raise ConfigError(f"timeout must be a number of seconds above 0, not {timeout!r}")
    try:
        json.dumps(dict(options or {}), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"options must be JSON (they go into every request): {exc}") from None
    return LLMClient(
        base_url,
        style_named(style),
        model,
        api_key,
        system=system,
        headers=dict(headers or {}),
        timeout=timeout,
        max_retries=max_retries,
        backoff=backoff,
        max_backoff=max_backoff,
        max_retry_wait=max_retry_wait,
        options=dict(options or {}),
    )


class LLMClient:
    """One model behind one API; safe to share between concurrent runs."""

    def __init__(
        self,
        base_url: str,
        style: Style,
        model: str,
        api_key: str | None,
        *,
        system: str,
        headers: dict[str, str],
        timeout: float,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        max_retry_wait: float = 60.0,
        options: dict[str, Any],
    ) -> None:
        self.base_url = base_url
        self.style = style
        self.model = model
        self.system = system
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_wait = max_retry_wait
        self.options = options
        self._url = style.url(base_url, model, stream=False)
        self._endpoint = httpx.URL(self._url)  # parsed once, not per request
        # Gemini streams from another endpoint; the other styles' is the same one.
        self._stream_url = style.url(base_url, model, stream=True)
        self._stream_endpoint = (
            self._endpoint if self._stream_url == self._url else httpx.URL(self._stream_url)
        )
        self._headers = {**style.headers(api_key), **headers}
        self._secrets = _secrets(api_key, self._headers, base_url)
        self._http: httpx.AsyncClient | None = None
        self._lean: LeanClient | None = None
        self._lean_suits = lean_suits(self._url)  # plain http://, not proxied
        # The endpoints as messages show them (a key in the query masked), made once
        self._shown = {False: _shown(self._url), True: _shown(self._stream_url)}
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"LLMClient({self.style.name!r}, {self.model!r}, {_shown(self.base_url)!r})"

    # -- one request ---------------------------------------------------------------------------

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        system: str = "",
        tools: Sequence[Tool] = (),
        stream: bool = False,
        on_text: Callable[[str], None] | None = None,
        on_retry: Callable[[int, float], None] | None = None,
        deadline: float | None = None,
    ) -> Reply:
        """Ask the model once (retrying as the class docstring says) and return its reply.

        ``on_retry(status, wait_seconds)`` hears about each retry; ``deadline`` is a
        ``time.monotonic()`` value no retry waits past.
        """
        body = self.style.body(
            self.model, system, messages, tools, stream=stream, options=self.options
        )
        attempt = 0
        while True:
            streamed = False

            def heard(delta: str) -> None:
                nonlocal streamed
                streamed = True
                if on_text is not None:
                    on_text(delta)

            try:
                return await self._request(body, tools, stream=stream, on_text=heard)
            except ProviderError as exc:
                if streamed or not exc.retryable or attempt >= self.max_retries:
                    raise
                failure = exc
            asked = failure.detail.get("retry_after")  # the provider's own words, uncapped
            if isinstance(asked, float):
                wait = min(asked, MAX_RETRY_AFTER)
                waits = _seconds(wait) + (
                    f"; the provider asked for {_seconds(asked)}" if wait < asked else ""
                )
            else:
                wait = retry_delay({}, attempt, self.backoff, self.max_backoff)
                waits = _seconds(wait)
            if deadline is not None and time.monotonic() + wait > deadline:
                raise ProviderError(
                    f"gave up after {attempt + 1} attempts: the next retry (in {waits}) "
                    "would pass the run's deadline",
                    status=failure.status,
                    body=failure.body,
                ) from failure
            if isinstance(asked, float) and asked > self.max_retry_wait:
                refused = ProviderError(
                    f"gave up after {attempt + 1} attempts: the provider asks to wait "
                    f"{_seconds(asked)} before a retry, more than max_retry_wait "
                    f"({_seconds(self.max_retry_wait)})",
                    status=failure.status,
                    body=failure.body,
                )
                refused.detail["retry_after"] = asked  # when the caller may come back
                raise refused from failure
            if on_retry is not None:
                on_retry(failure.status, wait)  # what is waited: at most MAX_RETRY_AFTER
            await asyncio.sleep(wait)
            attempt += 1

    async def _request(
        self,
        body: dict[str, Any],
        tools: Sequence[Tool],
        *,
        stream: bool,
        on_text: Callable[[str], None],
    ) -> Reply:
        # ``timeout`` bounds the whole request (the transports' own read timeouts apply to
        # each read only: a server sending a byte, or an SSE comment, now and then would hold
        # the run forever); a stream gets ``timeout`` again with each event it sends.
        loop = asyncio.get_running_loop()
        url = self._shown[stream]  # for the messages
        try:
            async with asyncio.timeout(self.timeout) as bound:
                async with self._exchange(body, stream=stream) as response:
                    if response.status_code != 200:
                        start, _ = await read_at_most(response, _ERROR_BYTES)
                        raise self._refused(response, start.decode("utf-8", "replace"), url)
                    kind = response.headers.get("content-type", "")
                    if stream and "text/event-stream" in kind:
                        parser = self.style.stream_parser(on_text, tools)
                        try:
                            streamed = 0
                            async for event, data in read_events(response):
                                bound.reschedule(loop.time() + self.timeout)
                                streamed += len(data)
                                if streamed > MAX_ANSWER_BYTES:
                                    raise self._too_large(url)
                                parser.feed(event, data)
                            reply = parser.finish()
                        except _SHAPE_ERRORS as exc:
                            raise self._shape_error(exc, url) from exc
                        if not parser.ended:
                            raise ProviderError(
                                f"the answer streamed from {url} was cut off: it ended "
                                "without the provider's end of message",
                                status=200,
                            )
                        return reply
                    payload, cut = await read_at_most(response, MAX_ANSWER_BYTES)
                    if cut:
                        raise self._too_large(url)
        except (httpx.HTTPError, LeanError) as exc:
            raise ProviderError(f"no answer from {url}: {_describe(exc)}") from exc
        except TimeoutError as exc:
            raise ProviderError(
                f"no answer from {url} within {self.timeout:g}s (the client's timeout)"
            ) from exc
        try:
            decoded = strictjson.loads(payload)
        except ValueError:
            raise ProviderError(
                f"{url} answered with something that is not JSON",
                status=200,
                body=payload[:500].decode("utf-8", "replace"),
            ) from None
        try:
            reply = self.style.parse(decoded, tools)
        except _SHAPE_ERRORS as exc:
            raise self._shape_error(exc, url) from exc
        if reply.text:
            on_text(reply.text)  # a whole answer is one "delta" for streaming consumers
        return reply

    @contextlib.asynccontextmanager
    async def _exchange(
        self, body: dict[str, Any], *, stream: bool
    ) -> AsyncIterator[httpx.Response | LeanResponse]:
        """The model server's answer to ``body``, its body not read yet."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # Connections belong to the loop that opened them; a new loop needs new ones.
            self._http, self._lean, self._loop = None, None, loop
        if self._lean_suits:
            # A model server on plain HTTP (usually on this machine or network) gets the lean
            # client: a served agent pays for one model request or more per task.
            if self._lean is None:
                self._lean = LeanClient(
                    self._url,
                    self._headers,
                    connect_timeout=min(self.timeout, 10.0),
                    read_timeout=self.timeout,
                )
            url = self._stream_url if stream else self._url
            async with await self._lean.post(url, to_json(body)) as response:
                yield response
            return
        if self._http is None:
            self._http = httpx.AsyncClient(
                headers=self._headers,
                timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
            )
        endpoint = self._stream_endpoint if stream else self._endpoint
        async with self._http.stream("POST", endpoint, json=body) as answer:
            yield answer

    def _too_large(self, url: str) -> ProviderError:
        return ProviderError(
            f"the answer from {url} is larger than {MAX_ANSWER_BYTES} bytes; not read on",
            status=200,
        )

    def _shape_error(self, exc: Exception, url: str) -> ProviderError:
        return ProviderError(
            f"{url} answered in a shape this client does not expect: {_describe(exc)}",
            status=200,
        )

    def _refused(
        self, response: httpx.Response | LeanResponse, text: str, url: str
    ) -> ProviderError:
        status = response.status_code
        shown = self._masked(text)  # a provider may echo the key ("Incorrect API key: sk-...")
        error = ProviderError(
            f"{url} answered {status}: {_error_text(shown)}", status=status, body=shown[:2000]
        )
        if status in RETRY_STATUSES:
            error.retryable = True
            wait = _retry_after(response.headers)
            if wait is None:
                wait = _retry_info(text)
            if wait is not None:
                error.detail["retry_after"] = wait  # as asked; ``complete`` caps what it waits
        else:
            error.retryable = False
        return error

    def _masked(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    async def aclose(self) -> None:
        """Close pooled connections (the client opens new ones if used again)."""
        http, lean, self._http, self._lean = self._http, self._lean, None, None
        if self._loop is asyncio.get_running_loop():
            if http is not None:
                await http.aclose()
            if lean is not None:
                await lean.aclose()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the agent loop ------------------------------------------------------------------------

    async def run(self, prompt: str | Sequence[ChatMessage], **options: Any) -> RunResult:
        """Run the agent loop (see ``toolmesh.llm.loop.run``) and return its result."""
        from toolmesh.llm.loop import run

        return await run(self, prompt, **options)

    async def stream(
        self, prompt: str | Sequence[ChatMessage], **options: Any
    ) -> AsyncIterator[RunEvent]:
        """The agent loop as events: text deltas, tool calls, tool events and results, retries,
        and last a ``done`` event carrying the RunResult. Stopping iteration cancels the run."""
        from toolmesh.llm.loop import run

        queue: asyncio.Queue[RunEvent | None] = asyncio.Queue()
        options.setdefault("stream", True)
        task = asyncio.ensure_future(run(self, prompt, on_event=queue.put_nowait, **options))
        task.add_done_callback(lambda _task: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event  # the run's own ``done`` comes last
            task.result()  # the run's exception, when it raised
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


def retry_delay(
    headers: Mapping[str, str], attempt: int, backoff: float, max_backoff: float
) -> float:
    """Seconds to wait before retry ``attempt`` (0, 1, ...): what ``Retry-After`` says, else
    ``backoff * 2**attempt`` (at most ``max_backoff``) with up to 20% jitter taken off."""
    told = _retry_after(headers)
    if told is not None:
        return told
    wait = min(max_backoff, backoff * 2.0**attempt)
    return wait * (1.0 - 0.2 * random.random())  # noqa: S311 - jitter, not cryptography


def _retry_after(headers: Mapping[str, str]) -> float | None:
    lowered = {k.lower(): v for k, v in headers.items()}
    milliseconds = lowered.get("retry-after-ms")
    if milliseconds is not None:
        try:
            seconds = float(milliseconds) / 1000
        except ValueError:
            pass
        else:
            if math.isfinite(seconds):
                return max(0.0, seconds)
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _shown(url: str) -> str:
    """``url`` as messages show it: an API key in its query (Google's ``?key=``) masked."""
    parts = urllib.parse.urlsplit(url)
    if not parts.query:
        return url
    query = [
        f"{pair.partition('=')[0]}=***"
        if pair.partition("=")[0].lower() in _SECRET_PARAMS and pair.partition("=")[2]
        else pair
        for pair in parts.query.split("&")
    ]
    return urllib.parse.urlunsplit(parts._replace(query="&".join(query)))


_SECRET_PARAMS = frozenset({"key", "api_key", "apikey", "access_token"})
_SECRET_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
_SECRET_MIN_CHARS = 8  # shorter is no real key ("EMPTY" for vLLM), and masking it would garble


def _secrets(api_key: str | None, headers: Mapping[str, str], url: str) -> list[str]:
    """The credentials this client sends (its key, auth headers, a ``?key=``), longest first:
    what an error message must not repeat."""
    found = [api_key or ""]
    for name, value in headers.items():
        if name.lower() in _SECRET_HEADERS:
            found += [value, value.partition(" ")[2]]  # "Bearer KEY": the key alone too
    query = urllib.parse.urlsplit(url).query
    found += [v for k, v in urllib.parse.parse_qsl(query) if k.lower() in _SECRET_PARAMS]
    distinct = {s for s in found if len(s) >= _SECRET_MIN_CHARS}
    return sorted(distinct, key=len, reverse=True)


def _seconds(value: float) -> str:
    return f"{round(value, 3):g}s"


def _retry_info(text: str) -> float | None:
    """The wait a Google API puts in its error body instead of a header: a ``RetryInfo``
    detail, ``{"retryDelay": "30s"}``; None when there is none."""
    if "retryDelay" not in text:  # most bodies: not parsed at all
        return None
    try:
        details = _google_error(strictjson.loads(text))["error"]["details"]
    except (ValueError, KeyError, TypeError):
        return None
    for detail in details if isinstance(details, list) else ():
        delay = detail.get("retryDelay") if isinstance(detail, dict) else None
        if isinstance(delay, str) and delay.endswith("s"):
            with contextlib.suppress(ValueError):
                seconds = float(delay[:-1])
                if math.isfinite(seconds):
                    return max(0.0, seconds)
    return None


def _google_error(payload: Any) -> Any:
    """An error body as a Google API may wrap it, in a list of one (as google-genai reads it,
    a stream's endpoint answers so), unwrapped."""
    return payload[0] if isinstance(payload, list) and len(payload) == 1 else payload


def _error_text(text: str) -> str:
    try:
        payload = strictjson.loads(text)
    except ValueError:
        return text[:300] or "(empty answer)"
    payload = _google_error(payload)
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:300]
    if isinstance(error, str):
        return error[:300]
    return text[:300]


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
