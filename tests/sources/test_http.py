"""Declarative HTTP tools against a real starlette app on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fixtures.web import serve_app
from toolmesh import ConfigError, Toolkit
from toolmesh.sources import http as http_module
from toolmesh.sources.http import HttpEndpoint, HttpSource, http_tool, sources_from_manifest

release = asyncio.Event()


async def weather(request: Request) -> JSONResponse:
    return JSONResponse(
        {
            "city": request.path_params["city"],
            "units": request.query_params.get("units"),
            "tags": request.query_params.getlist("tag"),
            "auth": request.headers.get("authorization"),
        }
    )


async def echo(request: Request) -> JSONResponse:
    raw = await request.body()
    parsed = await request.form() if b"=" in raw and b"{" not in raw else None
    form = dict(parsed) if parsed is not None else None
    return JSONResponse(
        {
            "method": request.method,
            "query": dict(request.query_params),
            "content_type": request.headers.get("content-type"),
            "json": await request.json()
            if request.headers.get("content-type") == "application/json"
            else None,
            "form": form,
            "form_items": [list(item) for item in parsed.multi_items()] if parsed else None,
            "raw": raw.decode() if form is None else None,
            "trace": request.headers.get("x-trace"),
        }
    )


async def status(request: Request) -> Response:
    code = int(request.path_params["code"])
    return PlainTextResponse(f"status {code} body", status_code=code)


async def slow(request: Request) -> PlainTextResponse:
    await release.wait()
    return PlainTextResponse("late")


APP = Starlette(
    routes=[
        Route("/weather/{city}", weather),
        Route("/echo", echo, methods=["GET", "POST", "PUT", "DELETE"]),
        Route("/status/{code}", status),
        Route("/slow", slow),
        Route("/text", lambda r: PlainTextResponse("plain words")),
    ]
)


@pytest.fixture
async def base() -> AsyncIterator[str]:
    release.clear()
    async with serve_app(APP) as url:
        yield url
    release.set()


async def test_url_template_query_and_env_header(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEATHER_TOKEN", "s3cret")
    forecast = http_tool(
        "forecast",
        base + "/weather/{city}",
        description="The weather of a city",
        parameters={
            "city": {"type": "string", "description": "City name"},
            "units": {"type": "string", "enum": ["metric", "imperial"]},
            "tag": {"type": "array", "items": {"type": "string"}},
        },
        query={"units": "{units}", "tag": "{tag}"},
        headers={"Authorization": "Bearer ${WEATHER_TOKEN}"},
        result="json",
    )
    assert forecast.input_schema["required"] == ["city"]
    assert forecast.input_schema["properties"]["city"]["description"] == "City name"
    async with Toolkit(forecast) as kit:
        result = await kit.execute(
            "forecast", {"city": "São Paulo", "units": "metric", "tag": ["a", "b"]}
        )
        assert result.success, result.error
        assert result.data == {
            "city": "São Paulo",
            "units": "metric",
            "tags": ["a", "b"],
            "auth": "Bearer s3cret",
        }
        assert result.metadata["status"] == 200
        left_out = await kit.execute("forecast", {"city": "Oslo"})
        assert left_out.data["units"] is None and left_out.data["tags"] == []
        wrong = await kit.execute("forecast", {"city": "Oslo", "units": "kelvin"})
        assert wrong.error_code == "invalid_arguments"


async def test_secrets_never_appear_in_definitions_results_or_logs(
    base: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("API_TOKEN", "very-secret-value")
    caplog.set_level(logging.DEBUG)
    probe = http_tool("probe", base + "/status/{code}", headers={"X-Key": "${API_TOKEN}"})
    async with Toolkit(probe, store=":memory:") as kit:
        failed = await kit.execute("probe", {"code": "500"})
        listing = kit.definitions()
    assert failed.is_error and failed.metadata["status"] == 500
    everything = repr(listing) + failed.model_dump_json() + caplog.text + repr(probe)
    assert "very-secret-value" not in everything


async def test_arguments_cannot_pull_environment_variables_into_headers(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("API_TOKEN", "very-secret-value")
    trace = http_tool(
        "trace", base + "/echo", headers={"X-Trace": "{trace} by ${API_TOKEN}"}, result="json"
    )
    result = await Toolkit(trace).execute("trace", {"trace": "${API_TOKEN}"})
    assert result.data["trace"] == "${API_TOKEN} by very-secret-value"


async def test_missing_env_variable_is_an_error_result(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    probe = http_tool("probe", base + "/text", headers={"X-Key": "${NOT_SET_ANYWHERE}"})
    result = await Toolkit(probe).execute("probe")
    assert result.is_error
    assert "'NOT_SET_ANYWHERE' (header 'X-Key') is not set" in (result.error or "")


@pytest.mark.parametrize(
    ("code", "text"),
    [(404, "HTTP 404 Not Found: status 404 body"), (503, "HTTP 503 Service Unavailable")],
)
async def test_non_2xx_is_an_error_result_with_the_status(base: str, code: int, text: str) -> None:
    probe = http_tool("probe", base + "/status/{code}")
    result = await Toolkit(probe).execute("probe", {"code": str(code)})
    assert result.is_error and result.error_code == "tool_error"
    assert result.metadata["status"] == code
    assert (result.error or "").startswith(text)
    ok = await Toolkit(probe).execute("probe", {"code": "204"})
    assert ok.success and ok.metadata["status"] == 204


async def test_bodies_json_form_raw_and_leftover_arguments(base: str) -> None:
    create = http_tool(
        "create",
        base + "/echo",
        method="POST",
        parameters={
            "title": {"type": "string"},
            "count": {"type": "integer"},
            "trace": {"type": "string"},
        },
        headers={"X-Trace": "{trace}"},
        result="json",
    )
    form = http_tool(
        "form",
        base + "/echo",
        method="POST",
        body={"a": "{a}", "fixed": "yes"},
        body_format="form",
        parameters={"a": {"type": "string"}},
    )
    form_list = http_tool(  # a list repeats its key, a null is left out
        "form_list",
        base + "/echo",
        method="POST",
        body={"tags": "{tags}", "note": "{note}", "fixed": 1},
        body_format="form",
        parameters={"tags": {"type": "array", "items": {"type": "string"}}, "note": {}},
    )
    raw = http_tool(
        "raw",
        base + "/echo",
        method="PUT",
        body="<note>{text}</note>",
        body_format="raw",
        content_type="application/xml",
        parameters={"text": {"type": "string"}, "page": {"type": "integer"}},
    )
    kit = Toolkit(HttpSource([]), create, form, form_list, raw)
    async with kit:
        made = await kit.execute("create", {"title": "x", "count": 3, "trace": "t-1"})
        assert made.data["json"] == {"title": "x", "count": 3}  # leftovers: a JSON body
        assert made.data["trace"] == "t-1"
        sent = await kit.execute("form", {"a": "1 2"})
        assert sent.data["form"] == {"a": "1 2", "fixed": "yes"}
        listed = await kit.execute("form_list", {"tags": ["x", "y z"], "note": None})
        assert listed.data["form_items"] == [["tags", "x"], ["tags", "y z"], ["fixed", "1"]]
        put = await kit.execute("raw", {"text": "hi", "page": 2})
        assert put.data["raw"] == "<note>hi</note>"
        assert put.data["content_type"] == "application/xml"
        assert put.data["query"] == {"page": "2"}  # leftover beside a body template: the query


async def test_result_formats_and_timeouts(base: str) -> None:
    text = http_tool("text", base + "/text", result="text")
    as_json = http_tool("as_json", base + "/text", result="json")
    status = http_tool("status", base + "/text", result="status")
    slow = http_tool("slow", base + "/slow", timeout=0.2)
    async with Toolkit(text, as_json, status, slow) as kit:
        assert (await kit.execute("text")).output == "plain words"
        not_json = await kit.execute("as_json")
        assert not_json.is_error and not_json.error == "the response is not JSON"
        assert (await kit.execute("status")).data == 200
        late = await kit.execute("slow")
        assert late.is_error and "timed out after 0.2s" in (late.error or "")
        release.set()


async def test_unreachable_host_is_an_error_result() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        probe = http_tool("probe", f"http://127.0.0.1:{port}/x?secret=1")
        result = await Toolkit(probe).execute("probe")
    assert result.is_error and "ConnectError" in (result.error or "")
    assert "secret" not in (result.error or "")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "x", "url": "ftp://host"}, "url must be http"),
        ({"name": "x", "url": "http://h", "method": "FETCH"}, "unknown method"),
        ({"name": "x", "url": "http://h?k=${KEY}"}, "in headers only"),
        ({"name": "x", "url": "http://h", "colour": 1}, "unknown key"),
        ({"name": "x", "url": "http://h", "timeout": "soon"}, "timeout must be a number"),
        ({"name": "x", "url": "http://h", "result": "xml"}, "result must be"),
        ({"url": "http://h"}, "needs 'name'"),
        ({"name": "x", "url": "http://h", "required": ["ghost"]}, "'ghost' is no parameter"),
        (
            {"name": "x", "url": "http://h/{c}", "parameters": {"c": {"type": "nonsense"}}},
            "schema is broken",
        ),
    ],
)
def test_bad_declarations_are_config_errors(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sources_from_manifest({"kind": "http", **spec}, base_dir=Path())


async def test_manifest_endpoints_share_base_url_and_headers(base: str) -> None:
    (source,) = sources_from_manifest(
        {
            "kind": "http",
            "name": "api",
            "base_url": base,
            "headers": {"X-Trace": "shared"},
            "endpoints": [
                {"name": "get_echo", "url": "/echo", "result": "json"},
                {
                    "name": "city",
                    "url": "/weather/{city}",
                    "parameters": {"city": {"type": "string"}},
                },
            ],
        },
        base_dir=Path(),
    )
    async with Toolkit(source) as kit:
        assert kit.names() == ["get_echo", "city"]
        echoed = await kit.execute("get_echo")
        assert echoed.data["trace"] == "shared"
        assert (await kit.execute("city", {"city": "Rome"})).data["city"] == "Rome"


def test_endpoint_placeholders_say_where_each_argument_goes() -> None:
    endpoint = HttpEndpoint(
        name="e",
        url="http://h/{a}",
        query={"q": "{b}"},
        headers={"H": "x {c}"},
        body={"d": ["{d}"]},
        method="POST",
    )
    assert endpoint.placeholders() == {"a": "path", "b": "query", "c": "header", "d": "body"}


async def _headers_seen(request: Request) -> JSONResponse:
    return JSONResponse({"key": request.headers.get("x-api-key"), "path": request.url.path})


async def test_a_redirect_to_another_origin_carries_none_of_the_tools_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QA_API_KEY", "sk-never-elsewhere")
    elsewhere = Starlette(routes=[Route("/seen", _headers_seen)])
    async with serve_app(elsewhere) as other:

        async def home(request: Request) -> Response:
            if request.path_params["where"] == "away":
                return Response(status_code=302, headers={"Location": f"{other}/seen"})
            return Response(status_code=302, headers={"Location": "/seen"})

        origin = Starlette(routes=[Route("/go/{where}", home), Route("/seen", _headers_seen)])
        async with serve_app(origin) as base:
            tool = http_tool("go", base + "/go/{where}", headers={"X-Api-Key": "${QA_API_KEY}"})
            kit = Toolkit(tool)
            away = await kit.execute("go", {"where": "away"})
            assert away.success and away.data == {"key": None, "path": "/seen"}
            home_again = await kit.execute("go", {"where": "home"})  # same origin: kept
            assert home_again.data == {"key": "sk-never-elsewhere", "path": "/seen"}
            await kit.close()


async def test_an_argument_cannot_break_a_header_or_show_its_secret(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QA_TOKEN", "sk-SECRET-123")
    tool = http_tool("hdr", base + "/echo", headers={"Authorization": "Bearer ${QA_TOKEN} {extra}"})
    result = await Toolkit(tool).execute("hdr", {"extra": "a\r\nX-Evil: 1"})
    assert result.error_code == "tool_error"
    assert "holds a line break" in (result.error or "")
    assert "sk-SECRET" not in (result.error or "")


async def test_dot_path_values_are_values_and_an_omitted_body_is_no_body(base: str) -> None:
    weather_of = http_tool("w", base + "/weather/{city}")
    kit = Toolkit(weather_of, http_tool("post", base + "/echo", method="POST", body="{d}"))
    for value in (".", ".."):
        dotted = await kit.execute("w", {"city": value})
        assert dotted.success and dotted.data["city"] == value, dotted  # not a path step
    posted = await kit.execute("post", {})
    assert posted.success and posted.data["method"] == "POST" and posted.data["raw"] == ""
    await kit.close()


async def test_the_tools_timeout_bounds_a_trickling_answer() -> None:
    async def drip(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(100):  # a byte every 50 ms: each read is quick, the whole is not
                if release.is_set():
                    return
                yield b"x"
                await asyncio.sleep(0.05)

        return StreamingResponse(body())

    release.clear()
    async with serve_app(Starlette(routes=[Route("/drip", drip)])) as base:
        result = await Toolkit(http_tool("drip", base + "/drip", timeout=0.5)).execute("drip")
        release.set()
    assert result.error_code == "tool_error" and "timed out after 0.5s" in (result.error or "")


async def test_a_cookie_the_call_leaves_out_leaves_out_only_itself() -> None:
    async def cookies(request: Request) -> JSONResponse:
        return JSONResponse({"cookie": request.headers.get("cookie")})

    async with serve_app(Starlette(routes=[Route("/c", cookies)])) as base:
        tool = http_tool("c", base + "/c", headers={"Cookie": "sess={sess}; theme={theme}"})
        kit = Toolkit(tool)
        one = await kit.execute("c", {"sess": "S1"})
        both = await kit.execute("c", {"sess": "S1", "theme": "dark"})
        none = await kit.execute("c", {})
        await kit.close()
    assert one.data == {"cookie": "sess=S1"}
    assert both.data == {"cookie": "sess=S1; theme=dark"}
    assert none.data == {"cookie": None}


async def test_a_failure_under_a_prefix_names_the_called_tool() -> None:
    kit = Toolkit()
    kit.add(http_tool("down", "http://127.0.0.1:1/x"), prefix="p")  # nothing listens on port 1
    result = await kit.execute("p_down", {})
    assert not result.success and result.tool_name == "p_down"


async def test_binary_bodies_come_back_base64_and_nan_is_not_json() -> None:
    png = b"\x89PNG\r\n\x1a\n\x00\xff\xfe"

    async def image(request: Request) -> Response:
        return Response(png, media_type="image/png")

    async def nan(request: Request) -> Response:
        return Response(b'{"a": NaN}', media_type="application/json")

    app = Starlette(routes=[Route("/png", image), Route("/nan", nan)])
    async with serve_app(app) as base:
        kit = Toolkit(
            http_tool("png", base + "/png"),
            http_tool("nan", base + "/nan"),
            http_tool("nan_json", base + "/nan", result="json"),
        )
        image_result = await kit.execute("png", {})  # was text with U+FFFD for the bytes
        auto = await kit.execute("nan", {})  # was the float nan, which no peer can read
        strict = await kit.execute("nan_json", {})
        await kit.close()
    assert image_result.success and image_result.metadata["encoding"] == "base64"
    assert base64.b64decode(image_result.data) == png
    assert auto.success and auto.data == '{"a": NaN}'
    assert strict.error == "the response is not JSON"


async def test_a_huge_answer_is_read_only_up_to_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole body was held in memory (a 300 MB answer took 1 GB), then cut by the pipeline.
    monkeypatch.setattr(http_module, "MAX_BODY_BYTES", 1000)

    async def big(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(64):
                yield b"a" * 1024

        return StreamingResponse(body(), media_type=f"{request.path_params['kind']}")

    async with serve_app(Starlette(routes=[Route("/big/{kind:path}", big)])) as base:
        kit = Toolkit(
            http_tool("text", base + "/big/text/plain"),
            http_tool("json", base + "/big/application/json", result="json"),
        )
        text = await kit.execute("text", {})
        json_result = await kit.execute("json", {})
        await kit.close()
    assert text.success and text.data == "a" * 1000 and text.metadata["cut_at_bytes"] == 1000
    assert json_result.error == "the response is larger than 0 MiB; it cannot be read as JSON"


async def test_a_query_in_the_url_itself_is_kept() -> None:
    # httpx's `params=` replaces the URL's own query: `?format=json` was never sent.
    async def query(request: Request) -> JSONResponse:
        return JSONResponse(sorted(request.query_params.multi_items()))

    async with serve_app(Starlette(routes=[Route("/q", query)])) as base:
        kit = Toolkit(
            http_tool("fixed", base + "/q?format=json&v=2"),
            http_tool("mixed", base + "/q?format=json", query={"page": "{page}"}),
        )
        fixed = await kit.execute("fixed", {})
        mixed = await kit.execute("mixed", {"page": "3"})
        await kit.close()
    assert fixed.data == [["format", "json"], ["v", "2"]]
    assert mixed.data == [["format", "json"], ["page", "3"]]


async def test_http_tool_takes_what_a_declaration_takes(base: str) -> None:
    """`http_tool` lacked `joined_query`, `file_fields` and `input_schema`, which the manifest's
    `kind = "http"` and `endpoint_of` take."""
    schema = {
        "type": "object",
        "properties": {"tag": {"type": "array", "items": {"type": "string"}}},
        "required": ["tag"],
        "additionalProperties": False,
    }
    tagged = http_tool(
        "tagged",
        base + "/weather/oslo",
        query={"tag": "{tag}"},
        joined_query=["tag"],
        input_schema=schema,
        result="json",
    )
    assert tagged.input_schema == schema
    async with Toolkit(tagged) as kit:
        result = await kit.execute("tagged", {"tag": ["a", "b"]})
        assert result.success, result.error
        assert result.data["tags"] == ["a,b"]  # one comma-joined value, not the list repeated
        refused = await kit.execute("tagged", {"tag": ["a"], "extra": 1})
        assert refused.error_code == "invalid_arguments"


async def test_a_cookie_one_answer_sets_goes_with_no_later_call() -> None:
    # The pool's cookie jar kept `Set-Cookie` answers: a later call (of any session) that was
    # redirected to that host sent the first call's cookie along.
    async def login(request: Request) -> Response:
        answer = JSONResponse({"cookie": request.headers.get("cookie")})
        answer.set_cookie("sess", "user-a")
        return answer

    async def bounce(request: Request) -> Response:
        return Response(status_code=302, headers={"Location": "/seen"})

    async def seen(request: Request) -> JSONResponse:
        return JSONResponse({"cookie": request.headers.get("cookie")})

    app = Starlette(routes=[Route("/login", login), Route("/bounce", bounce), Route("/seen", seen)])
    async with serve_app(app) as base:
        source = HttpSource(
            [
                HttpEndpoint(name="login", url=base + "/login"),
                HttpEndpoint(name="bounce", url=base + "/bounce"),
            ]
        )
        async with Toolkit(source) as kit:
            first = await kit.execute("login", {})
            again = await kit.execute("login", {})
            redirected = await kit.execute("bounce", {})
    assert first.success and again.data == {"cookie": None}
    assert redirected.success and redirected.data == {"cookie": None}


async def test_an_error_body_quoting_a_secret_header_shows_it_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QA_QUOTED_KEY", "sk-quoted-back-42")

    async def refuse(request: Request) -> Response:
        return PlainTextResponse(f"invalid key {request.headers.get('x-key')}", status_code=401)

    async with serve_app(Starlette(routes=[Route("/r", refuse)])) as base:
        tool = http_tool("r", base + "/r", headers={"X-Key": "${QA_QUOTED_KEY}"})
        result = await Toolkit(tool).execute("r", {})
    assert result.metadata["status"] == 401
    assert result.error == "HTTP 401 Unauthorized: invalid key ***"


async def test_an_argument_cannot_add_a_cookie_or_a_control_character(base: str) -> None:
    cookie = http_tool("cookie", base + "/echo", headers={"Cookie": "sess={sess}"})
    trace = http_tool("trace", base + "/echo", headers={"X-Trace": "{trace}"}, result="json")
    kit = Toolkit(cookie, trace)
    injected = await kit.execute("cookie", {"sess": "mine; admin=1"})  # was sent as two cookies
    assert injected.error_code == "tool_error"
    assert "argument 'sess' holds a ';'" in (injected.error or "")
    for bad in ("a\x01b", "a\x7fb", "a\x1bb"):  # were sent, and refused by the server (400)
        refused = await kit.execute("trace", {"trace": bad})
        assert refused.error_code == "tool_error"
        assert "holds a line break or a control character" in (refused.error or ""), refused
    tab = await kit.execute("trace", {"trace": "a\tb"})  # a tab is legal in a header value
    assert tab.success and tab.data["trace"] == "a\tb"
    await kit.close()


async def _raw_request(request: Request) -> JSONResponse:
    return JSONResponse(
        {
            "path": request.scope["raw_path"].decode(),
            "ids": request.headers.getlist("x-ids"),
            "key": request.headers.getlist("x-key"),
            "trace": request.headers.getlist("x-trace"),
            "query": sorted(request.query_params.multi_items()),
        }
    )


async def test_lists_and_objects_fill_urls_and_headers_comma_joined() -> None:
    # They went in as JSON text: /items/%5B%22a%22%2C%20%22b%22%5D and `X-Ids: [1, 2]`.
    async with serve_app(Starlette(routes=[Route("/{rest:path}", _raw_request)])) as base:
        tool = http_tool(
            "items",
            base + "/items/{ids}/{shape}",
            parameters={"ids": {"type": "array"}, "shape": {"type": "object"}, "h": {}},
            headers={"X-Ids": "{h}"},
        )
        kit = Toolkit(tool)
        result = await kit.execute(
            "items", {"ids": ["a/b", "c,d", 3, True], "shape": {"k": "v w"}, "h": [1, 2]}
        )
        await kit.close()
    assert result.success, result.error
    assert result.data["path"] == "/items/a%2Fb,c%2Cd,3,true/k,v%20w"
    assert result.data["ids"] == ["1,2"]


async def test_a_header_the_source_sets_is_never_replaced_by_an_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An endpoint's `{key}` header replaced the source's credential of that name, and with
    # another case both were sent.
    monkeypatch.setenv("QA_SOURCE_KEY", "sk-source")
    monkeypatch.setenv("QA_TOOL_TRACE", "tool-trace")
    async with serve_app(Starlette(routes=[Route("/{rest:path}", _raw_request)])) as base:
        filled = HttpEndpoint(name="filled", url=base + "/f", headers={"x-key": "{key}"})
        fixed = HttpEndpoint(name="fixed", url=base + "/g", headers={"x-trace": "${QA_TOOL_TRACE}"})
        source = HttpSource(
            [filled, fixed], headers={"X-Key": "${QA_SOURCE_KEY}", "X-Trace": "source-trace"}
        )
        kit = Toolkit(source)
        argued = await kit.execute("filled", {"key": "guessed"})
        plain = await kit.execute("fixed", {})
        await kit.close()
    assert argued.success, argued.error
    # the source's key, once; the argument neither replaces it nor goes to the query instead
    assert argued.data["key"] == ["sk-source"] and argued.data["query"] == []
    assert plain.data["trace"] == ["tool-trace"]  # a tool's own fixed header is more specific
