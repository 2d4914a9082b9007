"""OpenAPI 3.x import: the Swagger Petstore 3.0 document, called through a local petstore."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from anthropic.types import ToolParam
from google.genai import types as genai
from openai.types.chat import ChatCompletionFunctionToolParam
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fixtures.web import serve_app
from tests.llm.checks import assert_openai_strict, check_typed_dict
from toolmesh import ArgumentError, ConfigError, Toolkit
from toolmesh.llm import to_anthropic, to_gemini, to_openai
from toolmesh.sources import openapi as openapi_module
from toolmesh.sources.openapi import (
    OpenAPISource,
    load_document,
    openapi_endpoints,
    sources_from_manifest,
)

PETSTORE = Path(__file__).parent.parent / "fixtures" / "openapi" / "petstore3.yaml"
DOCUMENT: dict[str, Any] = yaml.safe_load(PETSTORE.read_text())
OPERATIONS = 19


class Store:
    """An in-memory petstore: just enough of the API to call through."""

    def __init__(self) -> None:
        self.pets: dict[int, dict[str, Any]] = {
            1: {"id": 1, "name": "Rex", "photoUrls": [], "status": "available"}
        }

    async def spec(self, request: Request) -> Response:
        return JSONResponse(DOCUMENT)

    async def get_pet(self, request: Request) -> Response:
        pet = self.pets.get(int(request.path_params["petId"]))
        return JSONResponse(pet) if pet else JSONResponse({"message": "Pet not found"}, 404)

    async def add_pet(self, request: Request) -> Response:
        pet = await request.json()
        pet.setdefault("id", max(self.pets) + 1)
        self.pets[pet["id"]] = pet
        return JSONResponse(pet)

    async def delete_pet(self, request: Request) -> Response:
        if request.headers.get("api_key") != "special-key":
            return JSONResponse({"message": "no api_key"}, 400)
        self.pets.pop(int(request.path_params["petId"]), None)
        return Response(status_code=200)

    async def by_status(self, request: Request) -> Response:
        wanted = request.query_params.get("status")
        return JSONResponse([p for p in self.pets.values() if p.get("status") == wanted])

    async def by_tags(self, request: Request) -> Response:
        return JSONResponse({"tags": request.query_params.getlist("tags")})

    async def upload(self, request: Request) -> Response:
        body = await request.body()
        return JSONResponse(
            {
                "code": 200,
                "type": request.headers.get("content-type"),
                "message": f"{request.query_params.get('additionalMetadata')}:{body.decode()}",
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/api/v3/openapi.json", self.spec),
                Route("/api/v3/pet", self.add_pet, methods=["POST"]),
                Route("/api/v3/pet/findByStatus", self.by_status),
                Route("/api/v3/pet/findByTags", self.by_tags),
                Route("/api/v3/pet/{petId:int}", self.get_pet),
                Route("/api/v3/pet/{petId:int}", self.delete_pet, methods=["DELETE"]),
                Route("/api/v3/pet/{petId:int}/uploadImage", self.upload, methods=["POST"]),
            ]
        )


@pytest.fixture
async def petstore() -> AsyncIterator[str]:
    async with serve_app(Store().app()) as url:
        yield url


def test_one_tool_per_operation_with_parameters_in_the_schema() -> None:
    source = OpenAPISource(PETSTORE, base_url="http://127.0.0.1:9/api/v3")
    tools = {t.name: t for t in source.tools()}
    assert len(tools) == OPERATIONS
    delete = tools["deletePet"].input_schema
    assert delete["required"] == ["petId"]
    assert delete["properties"]["petId"] == {
        "type": "integer",
        "format": "int64",
        "description": "Pet id to delete",
    }
    assert "api_key" in delete["properties"]  # a header parameter
    add = tools["addPet"]
    assert add.input_schema["required"] == ["body"]
    assert add.input_schema["properties"]["body"]["$ref"] == "#/$defs/Pet"
    pet = add.input_schema["$defs"]["Pet"]
    assert pet["properties"]["category"] == {"$ref": "#/$defs/Category"}
    assert set(add.input_schema["$defs"]) == {"Pet", "Category", "Tag"}
    assert "xml" not in json.dumps(add.input_schema) and "example" not in json.dumps(
        add.input_schema
    )
    assert add.description == "Add a new pet to the store.\n\nAdd a new pet to the store."
    assert add.definition.tags == ["pet"]
    assert add.definition.kind == "openapi"
    by_status = tools["findPetsByStatus"].input_schema["properties"]["status"]
    assert by_status["enum"] == ["available", "pending", "sold"]


def test_json_and_yaml_documents_give_the_same_tools(tmp_path: Path) -> None:
    as_json = tmp_path / "petstore.json"
    as_json.write_text(json.dumps(DOCUMENT))
    base = "http://127.0.0.1:9/api/v3"
    from_yaml = [t.input_schema for t in OpenAPISource(PETSTORE, base_url=base).tools()]
    from_json = [t.input_schema for t in OpenAPISource(as_json, base_url=base).tools()]
    assert from_yaml == from_json


def test_every_petstore_tool_fits_every_provider() -> None:
    tools = OpenAPISource(PETSTORE, base_url="http://127.0.0.1:9/api/v3").tools()
    for entry in to_openai(tools):
        check_typed_dict(ChatCompletionFunctionToolParam, entry)
        assert entry["function"]["strict"] is True
        assert_openai_strict(entry["function"]["parameters"])
    for entry in to_anthropic(tools):
        check_typed_dict(ToolParam, entry)
    (gemini,) = to_gemini(tools)
    assert len(genai.Tool.model_validate(gemini).function_declarations or []) == OPERATIONS


async def test_calls_through_a_local_petstore(petstore: str) -> None:
    source = OpenAPISource(petstore + "/api/v3/openapi.json", headers={"api_key": "special-key"})
    assert source.tools() == ()  # fetched when the toolkit starts
    async with Toolkit(source) as kit:
        assert source.status.state == "connected"
        assert len(kit) == OPERATIONS  # the relative server URL resolved against the document's
        got = await kit.execute("getPetById", {"petId": 1})
        assert got.success and got.data["name"] == "Rex"
        missing = await kit.execute("getPetById", {"petId": 99})
        assert missing.is_error and missing.metadata["status"] == 404
        made = await kit.execute(
            "addPet", {"body": {"name": "Tom", "photoUrls": [], "status": "pending"}}
        )
        assert made.data == {"name": "Tom", "photoUrls": [], "status": "pending", "id": 2}
        found = await kit.execute("findPetsByStatus", {"status": "pending"})
        assert [p["name"] for p in found.data] == ["Tom"]
        tags = await kit.execute("findPetsByTags", {"tags": ["a", "b"]})
        assert tags.data == {"tags": ["a", "b"]}
        uploaded = await kit.execute(
            "uploadFile", {"petId": 2, "additionalMetadata": "m", "body": "bytes"}
        )
        assert uploaded.data["message"] == "m:bytes"
        assert uploaded.data["type"] == "application/octet-stream"
        deleted = await kit.execute("deletePet", {"petId": 2})  # api_key from the source's headers
        assert deleted.success, deleted.error
        bad = await kit.execute("addPet", {"body": {"name": "no photo urls"}})
        assert bad.error_code == "invalid_arguments" and "photoUrls" in (bad.error or "")


async def test_an_unreachable_document_fails_the_source_not_the_toolkit(petstore: str) -> None:
    source = OpenAPISource(petstore + "/nothing-here.json")
    async with Toolkit(source) as kit:
        assert len(kit) == 0
    assert source.status.state == "failed"
    assert "404" in source.status.reason


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(openapi="2.0"), "OpenAPI 3.x expected"),
        (lambda d: d.pop("openapi") and d.update(swagger="2.0"), "found swagger 2.0"),
        (
            lambda d: d["paths"]["/pet"]["post"]["requestBody"]["content"][
                "application/json"
            ].update(schema={"$ref": "other.yaml#/Pet"}),
            r"paths\./pet\.post\.requestBody: \$ref 'other\.yaml#/Pet' points to another document",
        ),
        (
            lambda d: d["paths"]["/pet/{petId}"]["get"]["parameters"].append(
                {"$ref": "#/components/parameters/Nope"}
            ),
            r"paths\./pet/\{petId\}\.get\.parameters\[1\]: \$ref .* points nowhere",
        ),
        (lambda d: d.update(servers=[{"url": "/relative"}]), "is relative; give base_url"),
    ],
)
def test_bad_documents_are_config_errors_naming_the_place(change: Any, message: str) -> None:
    document = json.loads(json.dumps(DOCUMENT))
    change(document)
    with pytest.raises(ConfigError, match=message):
        OpenAPISource(document, base_url=None if "relative" in message else "http://h/v3")


def test_openapi_30_schema_details_become_json_schema() -> None:
    document = {
        "openapi": "3.0.3",
        "servers": [
            {"url": "https://{region}.example.com/v1", "variables": {"region": {"default": "eu"}}}
        ],
        "paths": {
            "/items/{id}": {
                "parameters": [{"name": "id", "in": "path", "schema": {"type": "string"}}],
                "post": {
                    "parameters": [
                        {
                            "name": "id",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 0, "exclusiveMinimum": True},
                        },
                        {"name": "session", "in": "cookie", "schema": {"type": "string"}},
                    ],
                    "requestBody": {
                        "content": {
                            "application/x-www-form-urlencoded": {
                                "schema": {"$ref": "#/components/schemas/Node"}
                            }
                        }
                    },
                },
            }
        },
        "components": {
            "schemas": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "note": {"type": "string", "nullable": True},
                        "next": {"$ref": "#/components/schemas/Node"},
                    },
                }
            }
        },
    }
    (endpoint,) = openapi_endpoints(document)
    assert endpoint.name == "post_items_id"
    assert endpoint.url == "https://eu.example.com/v1/items/{id}"
    schema = endpoint.schema()
    assert schema["properties"]["id_query"] == {"type": "integer", "exclusiveMinimum": 0}
    assert endpoint.query == {"id": "{id_query}"}
    assert endpoint.headers == {"Cookie": "session={session}"}
    assert endpoint.body_format == "form"
    assert schema["$defs"]["Node"]["properties"]["note"] == {"type": ["string", "null"]}
    assert schema["$defs"]["Node"]["properties"]["next"] == {"$ref": "#/$defs/Node"}


def test_manifest_entry(tmp_path: Path) -> None:
    (source,) = sources_from_manifest(
        {"kind": "openapi", "spec": PETSTORE.name, "base_url": "http://127.0.0.1:9/v3"},
        base_dir=PETSTORE.parent,
    )
    assert len(source.tools()) == OPERATIONS
    with pytest.raises(ConfigError, match="unknown key"):
        sources_from_manifest({"kind": "openapi", "spec": "x", "servers": 1}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="cannot read the document"):
        sources_from_manifest({"kind": "openapi", "spec": "missing.yaml"}, base_dir=tmp_path)


async def test_a_remote_document_of_an_odd_shape_fails_its_source_only() -> None:
    from toolmesh import tool

    odd = {**DOCUMENT, "servers": ["http://127.0.0.1:9/api/v3"]}  # strings, not objects

    async def document(request: Request) -> Response:
        return JSONResponse(odd)

    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    async with serve_app(Starlette(routes=[Route("/odd.json", document)])) as url:
        source = OpenAPISource(url + "/odd.json")
        async with Toolkit(source, ping) as kit:
            assert (await kit.execute("ping")).output == "pong"
    assert source.status.state == "failed" and "odd.json" in source.status.reason


def test_unquoted_yaml_dates_are_text() -> None:
    text = yaml.safe_dump(DOCUMENT) + "x-when: 2024-01-02\n"  # YAML reads a date object
    document = load_document(text, where="dated.yaml")
    assert document["x-when"] == "2024-01-02"
    json.dumps(document)  # JSON all the way down


async def test_a_remote_document_in_a_list_of_sources_is_opened(petstore: str) -> None:
    from toolmesh import tool

    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    source = OpenAPISource(petstore + "/api/v3/openapi.json")
    async with Toolkit([source, ping]) as kit:  # one list, as the signature allows
        assert source.status.state == "connected"
        assert "getPetById" in kit.names() and "ping" in kit.names()


def test_component_names_with_pointer_characters_resolve() -> None:
    # `a/b` is referenced as `a~1b`, `x~y` as `x~0y`, and `My Model` percent-encoded
    schemas = {
        "a/b": {"type": "object", "properties": {"size": {"type": "integer"}}},
        "x~y": {"type": "string", "enum": ["on", "off"]},
        "My Model": {"type": "object", "properties": {"n": {"type": "number"}}},
    }
    document = {
        "openapi": "3.0.3",
        "servers": [{"url": "http://127.0.0.1:9"}],
        "paths": {
            "/things": {
                "post": {
                    "operationId": "make_thing",
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "box": {"$ref": "#/components/schemas/a~1b"},
                                        "mode": {"$ref": "#/components/schemas/x~0y"},
                                        "model": {"$ref": "#/components/schemas/My%20Model"},
                                    },
                                }
                            }
                        }
                    },
                }
            }
        },
        "components": {"schemas": schemas},
    }
    (tool,) = OpenAPISource(document).tools()
    schema = tool.input_schema
    assert set(schema["$defs"]) == {"a/b", "x~y", "My Model"}
    properties = schema["properties"]["body"]["properties"]
    assert properties["box"] == {"$ref": "#/$defs/a~1b"}
    assert properties["mode"] == {"$ref": "#/$defs/x~0y"}
    tool.validate({"body": {"box": {"size": 2}, "mode": "on", "model": {"n": 1.5}}})
    with pytest.raises(ArgumentError):
        tool.validate({"body": {"box": {"size": "big"}}})
    with pytest.raises(ArgumentError):
        tool.validate({"body": {"mode": "sideways"}})
    (openai,) = to_openai([tool])
    assert_openai_strict(openai["function"]["parameters"])
    (anthropic,) = to_anthropic([tool])
    check_typed_dict(ToolParam, anthropic)
    (gemini,) = to_gemini([tool])
    genai.Tool.model_validate(gemini)


def test_yaml_aliases_of_aliases_are_refused_not_expanded() -> None:
    # 500 bytes that expand to 10**7 values: every alias became a copy (3 s and 250 MB here;
    # each level more, ten times that: 10**8 took 35 s and 2.3 GB).
    lines = ['openapi: "3.0.0"', "paths: {}", "x-bomb:", "  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 7):
        lines.append(f"  a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    with pytest.raises(ConfigError, match=r"^bomb.yaml: the document expands to far more values"):
        load_document("\n".join(lines), where="bomb.yaml")


def test_yaml_aliases_within_reason_are_kept() -> None:
    text = """
openapi: "3.0.0"
paths:
  /a:
    get:
      operationId: a
      parameters: &shared [{name: q, in: query, schema: {type: integer}}]
  /b:
    get:
      operationId: b
      parameters: *shared
"""
    document = load_document(text, where="aliases.yaml")
    endpoints = openapi_endpoints(document, base_url="http://127.0.0.1:1")
    assert [e.input_schema["properties"] for e in endpoints if e.input_schema] == [
        {"q": {"type": "integer"}},
        {"q": {"type": "integer"}},
    ]


async def test_a_multipart_body_is_sent_as_form_data_with_its_files() -> None:
    document = {
        "openapi": "3.0.3",
        "paths": {
            "/upload": {
                "post": {
                    "operationId": "upload",
                    "requestBody": {
                        "content": {
                            "multipart/form-data": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "title": {"type": "string"},
                                        "tags": {"type": "array", "items": {"type": "string"}},
                                        "report": {"type": "string", "format": "binary"},
                                    },
                                    "required": ["report"],
                                }
                            }
                        }
                    },
                }
            }
        },
    }

    async def upload(request: Request) -> Response:
        form = await request.form()
        report = form["report"]
        assert not isinstance(report, str)  # an uploaded file, with a file name
        return JSONResponse(
            {
                "title": form["title"],
                "tags": form.getlist("tags"),
                "file": report.filename,
                "content": (await report.read()).decode(),
            }
        )

    async with serve_app(Starlette(routes=[Route("/upload", upload, methods=["POST"])])) as url:
        kit = Toolkit(OpenAPISource(document, base_url=url))
        schema = kit["upload"].input_schema["properties"]["body"]
        assert schema["properties"]["report"] == {
            "type": "string",
            "description": "the file's content, as text",
        }
        body = {"title": "Q3", "tags": ["a", "b"], "report": "line 1\nline 2"}
        result = await kit.execute("upload", {"body": body})
        await kit.close()
    assert result.success, result.error
    assert result.data == {
        "title": "Q3",
        "tags": ["a", "b"],
        "file": "report",
        "content": "line 1\nline 2",
    }


async def test_a_query_array_with_explode_false_is_one_comma_joined_value() -> None:
    array = {"type": "array", "items": {"type": "string"}}
    document = {
        "openapi": "3.0.3",
        "paths": {
            "/find": {
                "get": {
                    "operationId": "find",
                    "parameters": [
                        {"name": "tags", "in": "query", "explode": False, "schema": array},
                        {"name": "ids", "in": "query", "schema": array},  # explode: true
                    ],
                }
            }
        },
    }

    async def find(request: Request) -> Response:
        params = request.query_params
        return JSONResponse({"tags": params.getlist("tags"), "ids": params.getlist("ids")})

    async with serve_app(Starlette(routes=[Route("/find", find)])) as url:
        kit = Toolkit(OpenAPISource(document, base_url=url))
        result = await kit.execute("find", {"tags": ["a", "b"], "ids": ["1", "2"]})
        await kit.close()
    assert result.success, result.error
    assert result.data == {"tags": ["a,b"], "ids": ["1", "2"]}  # one joined value; repeated


def _with_body(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    body = {"content": {"application/json": {"schema": schema}}}
    return {
        "openapi": "3.0.3",
        "servers": [{"url": "http://127.0.0.1:9"}],
        "paths": {"/x": {"post": {"operationId": "x", "requestBody": body}}},
        "components": components,
    }


@pytest.mark.parametrize(
    ("schema", "components", "message"),
    [
        # inlined references that contain themselves: a RecursionError while building
        (
            {"$ref": "#/components/schemas/A/properties/b"},
            {
                "schemas": {
                    "A": {
                        "type": "object",
                        "properties": {
                            "b": {
                                "type": "object",
                                "properties": {
                                    "c": {"$ref": "#/components/schemas/A/properties/b"}
                                },
                            }
                        },
                    }
                }
            },
            r"\.properties\.c: \$ref '#/components/schemas/A/properties/b' is inside itself",
        ),
        (
            {"$ref": "#/components/x-shapes/Node"},
            {
                "x-shapes": {
                    "Node": {
                        "type": "object",
                        "properties": {"next": {"$ref": "#/components/x-shapes/Node"}},
                    }
                }
            },
            r"\$ref '#/components/x-shapes/Node' is inside itself",
        ),
        # components that are only references round a circle: a RecursionError on every call
        (
            {"$ref": "#/components/schemas/A"},
            {
                "schemas": {
                    "A": {"$ref": "#/components/schemas/B"},
                    "B": {"$ref": "#/components/schemas/A"},
                }
            },
            r"-> #/components/schemas/A: \$ref '#/components/schemas/B' refers to itself",
        ),
        (
            {"$ref": "#/components/schemas/A"},
            {"schemas": {"A": {"$ref": "#/components/schemas/A"}}},
            r"\$ref '#/components/schemas/A' refers to itself",
        ),
        # components that only refer to each other through allOf/anyOf/oneOf: a RecursionError
        # out of OpenAPISource (deriving the parameters), or on every call (validating)
        (
            {"allOf": [{"$ref": "#/components/schemas/S"}]},
            {
                "schemas": {
                    "S": {"allOf": [{"$ref": "#/components/schemas/T"}]},
                    "T": {"allOf": [{"$ref": "#/components/schemas/S"}]},
                }
            },
            r"paths\./x\.post: schema '#/components/schemas/[ST]' leads back to itself through "
            "allOf/anyOf/oneOf/not alone",
        ),
        (
            {"type": "object", "properties": {"q": {"$ref": "#/components/schemas/U"}}},
            {
                "schemas": {
                    "U": {"anyOf": [{"type": "string"}, {"$ref": "#/components/schemas/V"}]},
                    "V": {"allOf": [{"$ref": "#/components/schemas/U"}, {"minLength": 1}]},
                }
            },
            r"schema '#/components/schemas/[UV]' leads back to itself",
        ),
    ],
)
def test_reference_cycles_are_config_errors_not_recursion(
    schema: dict[str, Any], components: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        OpenAPISource(_with_body(schema, components))


def test_a_document_nested_too_deeply_is_a_config_error() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(5000):
        deep = {"allOf": [deep]}
    with pytest.raises(ConfigError, match="the document is nested too deeply"):
        OpenAPISource(_with_body(deep, {}))
    nested = "[" * 5000 + "]" * 5000
    for text in ('{"openapi": "3.0.3", "x": ' + nested + "}", f"openapi: 3.0.3\nx: {nested}\n"):
        with pytest.raises(ConfigError, match="x: the document is nested too deeply"):
            load_document(text, where="x")  # JSON, then YAML


def _one_operation(**document: Any) -> dict[str, Any]:
    return {"openapi": "3.0.3", "paths": {"/x": {"get": {"operationId": "x"}}}, **document}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            _one_operation(servers=[{"url": "https://{region}.example.com"}]),
            r"has variable 'region', which servers\[0\] does not declare",
        ),  # was a URL placeholder no argument fills: every call failed
        (
            _one_operation(
                servers=[{"url": "https://{region}.example.com", "variables": {"region": "eu"}}]
            ),
            r"servers\[0\]\.variables\.region needs a default",
        ),  # an AttributeError
        (
            _one_operation(servers=[{"url": "https://h", "variables": ["eu"]}]),
            r"servers\[0\]\.variables must be an object",
        ),
        (
            _one_operation(servers=["https://h"]),
            "servers must be a list of objects",
        ),
        (
            _with_body({"type": "object", "properties": [{"name": "a"}]}, {}),
            r"requestBody: properties must be an object of schemas",
        ),  # an AttributeError
        (
            {
                "openapi": "3.0.3",
                "paths": {"/x": {"post": {"parameters": [{"name": "b", "in": "body"}]}}},
            },
            r"paths\./x\.post: parameter 'b' is in 'body'; in must be path, query, header",
        ),  # was silently a query parameter
    ],
)
def test_malformed_servers_schemas_and_parameters_are_config_errors(
    document: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        OpenAPISource(document, base_url=None if "servers" in document else "http://h")


def test_a_document_whose_info_is_no_object_still_loads() -> None:
    source = OpenAPISource(_one_operation(info="Pets", servers=[{"url": "http://h"}]))  # was an
    assert source.name == "openapi:openapi" and [t.name for t in source.tools()] == ["x"]  # error


async def test_a_multipart_body_of_a_component_schema_sends_its_files() -> None:
    # The file fields were read from the body schema's own properties only: a body that is a
    # `$ref` to a component (the common way) sent its files as plain values.
    document = {
        "openapi": "3.0.3",
        "paths": {
            "/upload": {
                "post": {
                    "operationId": "upload",
                    "requestBody": {
                        "content": {
                            "multipart/form-data": {
                                "schema": {"$ref": "#/components/schemas/Upload"}
                            }
                        }
                    },
                }
            }
        },
        "components": {
            "schemas": {
                "Upload": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string"},
                        "report": {"type": "string", "format": "binary"},
                    },
                }
            }
        },
    }

    async def upload(request: Request) -> Response:
        form = await request.form()
        report = form["report"]
        return JSONResponse(
            {
                "title": form["title"],
                "is_file": not isinstance(report, str),
                "content": report if isinstance(report, str) else (await report.read()).decode(),
            }
        )

    async with serve_app(Starlette(routes=[Route("/upload", upload, methods=["POST"])])) as url:
        kit = Toolkit(OpenAPISource(document, base_url=url))
        schema = kit["upload"].input_schema["properties"]["body"]
        result = await kit.execute("upload", {"body": {"title": "Q3", "report": "line 1"}})
        await kit.close()
    assert schema["properties"]["report"] == {
        "type": "string",
        "description": "the file's content, as text",
    }
    assert result.success, result.error
    assert result.data == {"title": "Q3", "is_file": True, "content": "line 1"}


async def test_header_parameters_the_specification_ignores_cannot_replace_the_sources_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An `Authorization` header parameter let the model replace the source's credentials.
    monkeypatch.setenv("QA_OPENAPI_TOKEN", "sk-source-own")
    parameters = [
        {"name": name, "in": "header", "schema": {"type": "string"}}
        for name in ("Authorization", "content-type", "Accept", "X-Trace")
    ]
    document = {
        "openapi": "3.0.3",
        "paths": {"/who": {"get": {"operationId": "who", "parameters": parameters}}},
    }

    async def who(request: Request) -> Response:
        return JSONResponse({k: request.headers.get(k) for k in ("authorization", "x-trace")})

    async with serve_app(Starlette(routes=[Route("/who", who)])) as url:
        source = OpenAPISource(
            document, base_url=url, headers={"Authorization": "Bearer ${QA_OPENAPI_TOKEN}"}
        )
        kit = Toolkit(source)
        assert set(kit["who"].input_schema["properties"]) == {"X-Trace"}
        replaced = await kit.execute("who", {"Authorization": "Bearer stolen", "X-Trace": "t"})
        plain = await kit.execute("who", {"X-Trace": "t"})
        await kit.close()
    assert replaced.error_code == "invalid_arguments"
    assert plain.data == {"authorization": "Bearer sk-source-own", "x-trace": "t"}


async def test_a_trickling_document_fails_the_source_within_its_timeout() -> None:
    # httpx bounds each read: a byte every 50 ms held `toolkit.start()` for as long as the
    # server kept it up.
    stop = asyncio.Event()

    async def drip(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(100):
                if stop.is_set():
                    return
                yield b" "
                await asyncio.sleep(0.05)

        return StreamingResponse(body(), media_type="application/json")

    async with serve_app(Starlette(routes=[Route("/spec.json", drip)])) as url:
        source = OpenAPISource(url + "/spec.json", timeout=0.5)
        async with Toolkit(source) as kit:
            assert len(kit) == 0
        stop.set()
    assert source.status.state == "failed"
    assert source.status.reason.endswith("/spec.json: no whole answer within 0.5s")


async def test_a_document_larger_than_the_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openapi_module, "MAX_DOCUMENT_BYTES", 1000)  # it was read whole

    async def spec(request: Request) -> Response:
        return JSONResponse(DOCUMENT)  # far more than 1000 bytes

    async with serve_app(Starlette(routes=[Route("/spec.json", spec)])) as url:
        source = OpenAPISource(url + "/spec.json")
        async with Toolkit(source) as kit:
            assert len(kit) == 0
    assert source.status.state == "failed"
    assert "the document is larger than 1000 bytes" in source.status.reason


async def test_renamed_arguments_never_replace_another() -> None:
    # Query `id` became `id_query`, replacing the real `id_query` (an integer): that one could
    # no longer be sent, and one value went out for both. `body` likewise: `request_body`.
    string, integer = {"type": "string"}, {"type": "integer"}
    document = {
        "openapi": "3.0.3",
        "paths": {
            "/items/{id}": {
                "post": {
                    "operationId": "put_item",
                    "parameters": [
                        {"name": "id", "in": "path", "required": True, "schema": string},
                        {"name": "id_query", "in": "query", "required": True, "schema": integer},
                        {"name": "id", "in": "query", "schema": {"enum": ["a", "b"]}},
                        {"name": "body", "in": "query", "schema": string},
                        {"name": "request_body", "in": "query", "schema": string},
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                }
            }
        },
    }

    async def put_item(request: Request) -> Response:
        query = sorted(request.query_params.multi_items())
        return JSONResponse(
            {"id": request.path_params["id"], "query": query, "body": await request.json()}
        )

    async with serve_app(
        Starlette(routes=[Route("/items/{id}", put_item, methods=["POST"])])
    ) as url:
        kit = Toolkit(OpenAPISource(document, base_url=url))
        schema = kit["put_item"].input_schema
        arguments = {
            "id": "7",
            "id_query": 42,
            "id_query_2": "a",
            "body": "b",
            "request_body": "rb",
            "request_body_2": {"n": 1},
        }
        result = await kit.execute("put_item", arguments)
        await kit.close()
    assert list(schema["properties"]) == list(arguments)
    assert schema["properties"]["id_query"] == integer
    assert schema["required"] == ["id", "id_query", "request_body_2"]
    assert result.success, result.error
    assert result.data == {
        "id": "7",
        "query": [["body", "b"], ["id", "a"], ["id_query", "42"], ["request_body", "rb"]],
        "body": {"n": 1},
    }


def test_path_placeholders_renamed_in_one_pass() -> None:
    # Renamed one by one, `{a}` became `{a_path}`, then `{a_path}` (both of them) `{a_path_path}`.
    string = {"type": "string"}
    document = {
        "openapi": "3.0.3",
        "paths": {
            "/x/{a}/{a_path}/{q}": {
                "get": {
                    "operationId": "x",
                    "parameters": [
                        {"name": "a", "in": "query", "schema": string},
                        {"name": "q", "in": "query", "schema": string},
                        {"name": "a", "in": "path", "schema": string},
                        {"name": "a_path", "in": "path", "schema": string},
                    ],  # {q} is in the path only by its placeholder
                }
            }
        },
    }
    (endpoint,) = openapi_endpoints(document, base_url="http://127.0.0.1:9")
    assert endpoint.url == "http://127.0.0.1:9/x/{a_path}/{a_path_path}/{q_path}"
    assert endpoint.query == {"a": "{a}", "q": "{q}"}
    schema = endpoint.schema()
    assert list(schema["properties"]) == ["a", "q", "a_path", "a_path_path", "q_path"]
    assert schema["required"] == ["a_path", "a_path_path", "q_path"]


async def test_parameter_names_with_a_dollar_are_sent_as_named() -> None:
    # OData's `$top`: the `{$top}` placeholder was not one (a `$` in it read as ${VARIABLE}),
    # so `?$top={$top}` went out literally, and the value again as an extra query parameter.
    document = {
        "openapi": "3.0.3",
        "paths": {
            "/items/{$id}": {
                "get": {
                    "operationId": "list_items",
                    "parameters": [
                        {
                            "name": "$id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        },
                        {"name": "$top", "in": "query", "schema": {"type": "integer"}},
                        {"name": "X-$Trace", "in": "header", "schema": {"type": "string"}},
                    ],
                }
            }
        },
    }

    async def list_items(request: Request) -> Response:
        return JSONResponse(
            {
                "path": request.url.path,
                "query": sorted(request.query_params.multi_items()),
                "trace": request.headers.get("X-$Trace"),
            }
        )

    async with serve_app(
        Starlette(routes=[Route("/items/{rest:path}", list_items, methods=["GET"])])
    ) as url:
        kit = Toolkit(OpenAPISource(document, base_url=url))
        arguments = {"$id": "7", "$top": 3, "X-$Trace": "t1"}
        result = await kit.execute("list_items", arguments)
        await kit.close()
    assert result.success, result.error
    assert result.data == {"path": "/items/7", "query": [["$top", "3"]], "trace": "t1"}


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object", "propertyNames": {"$ref": "file:///etc/passwd"}}, "propertyNames"),
        ({"if": {"$ref": "other.json"}, "then": {}}, "if"),
        ({"if": {}, "then": {}, "else": {"$ref": "http://127.0.0.1:1/s.json"}}, "else"),
        ({"type": "array", "contains": {"$ref": "file:///x.json"}}, "contains"),
        ({"type": "array", "prefixItems": [{"$ref": "file:///x.json"}]}, "prefixItems"),
        ({"dependentSchemas": {"a": {"$ref": "file:///x.json"}}}, r"dependentSchemas\.a"),
        ({"unevaluatedProperties": {"$ref": "file:///x.json"}}, "unevaluatedProperties"),
        ({"contentSchema": {"$ref": "file:///x.json"}}, "contentSchema"),
        ({"not": {"$ref": "file:///x.json"}}, "not"),
        ({"patternProperties": {"^a": {"$ref": "file:///x.json"}}}, r"patternProperties\.\^a"),
    ],
)
def test_a_reference_to_another_document_is_refused_under_every_schema_keyword(
    schema: dict[str, Any], where: str
) -> None:
    # Keywords the importer did not walk (propertyNames, if, contains, ...) were copied with
    # their $ref: the document loaded, and the validator was left to refuse it (a file:// one it
    # once opened).
    with pytest.raises(ConfigError, match=rf"requestBody\.{where}: \$ref .* points to another doc"):
        OpenAPISource(_with_body(schema, {}))


def test_local_references_under_every_schema_keyword_are_resolved() -> None:
    # They were copied as they were: `#/components/...` means nothing in a tool's schema, so
    # every call failed on a schema the validator could not compile.
    key = {"type": "string", "pattern": "^[a-z]+$"}
    schema = {
        "type": "object",
        "$id": "https://example.com/body",  # would read the #/$defs/... refs against another doc
        "propertyNames": {"$ref": "#/components/schemas/Key"},
        "properties": {
            "tags": {
                "type": "array",
                "prefixItems": [{"$ref": "#/components/schemas/Key"}],
                "contains": {"$ref": "#/components/x-parts/Short"},
            },
            "n": {"if": {"$ref": "#/components/x-parts/Short"}, "then": {"minLength": 1}},
        },
        "dependentSchemas": {"n": {"$ref": "#/components/x-parts/NeedsTags"}},
    }
    components = {
        "schemas": {"Key": key},
        "x-parts": {"Short": {"maxLength": 3}, "NeedsTags": {"required": ["tags"]}},
    }
    (tool,) = OpenAPISource(_with_body(schema, components)).tools()
    body = tool.input_schema["properties"]["body"]
    assert body["propertyNames"] == {"$ref": "#/$defs/Key"} and "$id" not in body
    assert tool.input_schema["$defs"] == {"Key": key}
    assert body["properties"]["tags"]["prefixItems"] == [{"$ref": "#/$defs/Key"}]
    assert body["properties"]["tags"]["contains"] == {"maxLength": 3}  # inlined
    assert body["dependentSchemas"] == {"n": {"required": ["tags"]}}
    tool.validate({"body": {"tags": ["abc", "de"], "n": "x"}})
    for wrong in ({"Tags": []}, {"tags": ["long"]}, {"n": ""}):  # what draft-07 checks
        with pytest.raises(ArgumentError):
            tool.validate({"body": wrong})


def test_yaml_on_off_yes_no_are_text_as_yaml_1_2_reads_them() -> None:
    # PyYAML reads YAML 1.1: `enum: [on, off]` became [true, false], which no string matches,
    # and Norway's code NO became false.
    text = """
openapi: 3.0.3
servers: [{url: "http://127.0.0.1:9"}]
paths:
  /lights:
    get:
      operationId: setLight
      parameters:
        - {name: state, in: query, required: true, schema: {type: string, enum: [on, off]}}
        - {name: country, in: query, schema: {type: string, enum: [NO, SE, y, n, Yes, OFF]}}
        - {name: flags, in: query, schema: {enum: [true, True, TRUE, false, False, FALSE]}}
"""
    document = load_document(text, where="lights.yaml")
    (tool,) = OpenAPISource(document).tools()
    properties = tool.input_schema["properties"]
    assert properties["state"]["enum"] == ["on", "off"]
    assert properties["country"]["enum"] == ["NO", "SE", "y", "n", "Yes", "OFF"]
    assert properties["flags"]["enum"] == [True, True, True, False, False, False]
    tool.validate({"state": "on", "country": "NO"})


def test_yaml_numbers_are_read_as_yaml_1_2_reads_them() -> None:
    # PyYAML's 1.1 floats need a dot: `maximum: 1e6` was the text "1e6", and every call failed
    # ("maximum must be a number"); 10:30 was base 60 (630), 0755 octal, 1_000 a thousand.
    text = """
openapi: 3.0.3
servers: [{url: "http://127.0.0.1:9"}]
paths:
  /slots:
    get:
      operationId: book
      parameters:
        - {name: n, in: query, required: true, schema: {type: number, maximum: 1e6, minimum: -2.5E-3}}
        - {name: at, in: query, schema: {type: string, enum: [10:30, 11:00, 1_000]}}
        - {name: mode, in: query, schema: {type: integer, enum: [0755, 0o17, 0x1F, +3]}}
"""
    (tool,) = OpenAPISource(load_document(text, where="slots.yaml")).tools()
    properties = tool.input_schema["properties"]
    assert (properties["n"]["maximum"], properties["n"]["minimum"]) == (1e6, -0.0025)
    assert properties["at"]["enum"] == ["10:30", "11:00", "1_000"]
    assert properties["mode"]["enum"] == [755, 15, 31, 3]
    tool.validate({"n": 999_999.5, "at": "10:30", "mode": 755})


async def test_path_and_header_lists_and_objects_are_sent_in_their_style() -> None:
    # They were sent as JSON text: /items/%5B1%2C%202%5D and `X-Ids: [4, 5]`, where OpenAPI's
    # default (style simple) is /items/1,2 and `X-Ids: 4,5`.
    array = {"type": "array", "items": {"type": "string"}}
    shape = {"type": "object", "additionalProperties": {"type": "string"}}

    def path(name: str, schema: dict[str, Any], **style: Any) -> dict[str, Any]:
        return {"name": name, "in": "path", "required": True, "schema": schema, **style}

    parameters = [
        path("ids", array),
        path("obj", shape),
        path("exp", shape, explode=True),
        path("lab", array, style="label"),
        path("labx", array, style="label", explode=True),
        path("mat", array, style="matrix"),
        path("matx", array, style="matrix", explode=True),
        path("mato", shape, style="matrix", explode=True),
        path("one", {"type": "integer"}, style="matrix"),
        {"name": "X-Ids", "in": "header", "schema": array},
        {"name": "X-Shape", "in": "header", "schema": shape, "explode": True},
    ]
    template = "/{ids}/{obj}/{exp}/{lab}/{labx}/{mat}/{matx}/{mato}/{one}"
    document = {
        "openapi": "3.0.3",
        "paths": {template: {"get": {"operationId": "get", "parameters": parameters}}},
    }

    async def seen(request: Request) -> Response:
        headers = request.headers
        return JSONResponse(
            {
                "path": request.scope["raw_path"].decode(),
                "ids": headers.getlist("x-ids"),
                "shape": headers.getlist("x-shape"),
            }
        )

    arguments = {
        "ids": ["a b", "c,d", "é"],  # each item encoded; the commas between them are not
        "obj": {"R": "1", "G": "2"},
        "exp": {"R": "1", "G": "2"},
        "lab": ["x", "y"],
        "labx": ["x", "y"],
        "mat": ["x", "y"],
        "matx": ["x", "y"],
        "mato": {"R": "1", "G": "2"},
        "one": 5,
        "X-Ids": ["4", "5"],
        "X-Shape": {"R": "1", "G": "2"},
    }
    async with serve_app(Starlette(routes=[Route("/{rest:path}", seen)])) as url:
        kit = Toolkit(OpenAPISource(document, base_url=url))
        result = await kit.execute("get", arguments)
        await kit.close()
    assert result.success, result.error
    assert result.data == {
        "path": "/a%20b,c%2Cd,%C3%A9/R,1,G,2/R=1,G=2/.x,y/.x.y/;mat=x,y/;matx=x;matx=y/;R=1;G=2/"
        ";one=5",
        "ids": ["4,5"],
        "shape": ["R=1,G=2"],
    }


@pytest.mark.parametrize(
    ("parameter", "message"),
    [
        (
            {"name": "id", "in": "path", "required": True, "style": "form"},
            r"paths\./x/\{id\}\.get\.parameters\.id: style 'form' is not supported for a path "
            "parameter",
        ),
        (
            {"name": "X-Id", "in": "header", "style": "label"},
            r"parameters\.X-Id: style 'label' is not supported for a header parameter",
        ),
        (
            {"name": "id", "in": "path", "required": True, "explode": "yes"},
            r"parameters\.id: explode must be true or false, not 'yes'",
        ),
    ],
)
def test_a_path_or_header_style_no_request_can_have_is_a_config_error(
    parameter: dict[str, Any], message: str
) -> None:
    operation = {"operationId": "x", "parameters": [parameter]}
    document = {"openapi": "3.0.3", "paths": {"/x/{id}": {"get": operation}}}
    with pytest.raises(ConfigError, match=message):
        OpenAPISource(document, base_url="http://127.0.0.1:9")


async def test_a_header_the_source_sets_is_no_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    # The petstore's deletePet declares its `api_key` header: the model was offered it, and what
    # it filled in was sent instead of the source's secret (in another case, beside it).
    monkeypatch.setenv("QA_PETSTORE_KEY", "the-real-secret")
    string = {"type": "string"}
    parameters = [
        {"name": "api_key", "in": "header", "schema": string},
        {"name": "X-Api-Key", "in": "header", "schema": string},
        {"name": "session", "in": "cookie", "schema": string},
        {"name": "X-Trace", "in": "header", "schema": string},
        {"name": "petId", "in": "path", "required": True, "schema": {"type": "integer"}},
    ]
    document = {
        "openapi": "3.0.3",
        "paths": {
            "/pet/{petId}": {"delete": {"operationId": "deletePet", "parameters": parameters}}
        },
    }

    async def seen(request: Request) -> Response:
        return JSONResponse(
            {
                name: request.headers.getlist(name)
                for name in ("api_key", "x-api-key", "cookie", "x-trace")
            }
            | {"query": sorted(request.query_params.multi_items())}
        )

    async with serve_app(Starlette(routes=[Route("/pet/{id}", seen, methods=["DELETE"])])) as url:
        configured = {
            "api_key": "${QA_PETSTORE_KEY}",
            "x-api-key": "${QA_PETSTORE_KEY}",
            "Cookie": "session=${QA_PETSTORE_KEY}",
        }
        kit = Toolkit(OpenAPISource(document, base_url=url, headers=configured))
        offered = set(kit["deletePet"].input_schema["properties"])
        replaced = await kit.execute("deletePet", {"petId": 1, "api_key": "YOUR_API_KEY"})
        plain = await kit.execute("deletePet", {"petId": 1, "X-Trace": "t"})
        await kit.close()
    assert offered == {"petId", "X-Trace"}
    assert replaced.error_code == "invalid_arguments"
    assert plain.success, plain.error
    assert plain.data == {
        "api_key": ["the-real-secret"],
        "x-api-key": ["the-real-secret"],
        "cookie": ["session=the-real-secret"],
        "x-trace": ["t"],
        "query": [],
    }


def _ring(components: int, operations: int) -> dict[str, Any]:
    """Operations over a ring of components, each linking to the next (C0 -> C1 -> ... -> C0)."""
    schemas = {
        f"C{i}": {
            "type": "object",
            "properties": {
                "next": {"$ref": f"#/components/schemas/C{(i + 1) % components}"},
                "name": {"type": "string"},
            },
        }
        for i in range(components)
    }
    paths = {
        f"/p{i}": {
            "post": {
                "operationId": f"op{i}",
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {"$ref": f"#/components/schemas/C{i % components}"}
                        }
                    }
                },
            }
        }
        for i in range(operations)
    }
    return {
        "openapi": "3.0.3",
        "servers": [{"url": "http://127.0.0.1:9"}],
        "paths": paths,
        "components": {"schemas": schemas},
    }


def test_component_schemas_are_converted_and_checked_once_per_document(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every tool converted every component it reached afresh, and the cycle check walked them
    # all again per tool: 1,500 operations over 300 components took 12 s and 650 MB.
    walked: list[int] = []
    real_ref_cycle = openapi_module.ref_cycle

    def counting(schema: dict[str, Any]) -> str | None:
        walked.append(len(schema.get("$defs", {})))
        return real_ref_cycle(schema)

    monkeypatch.setattr(openapi_module, "ref_cycle", counting)
    tools = OpenAPISource(_ring(50, 200)).tools()
    assert len(tools) == 200
    assert sum(walked) == 50  # each component checked once, not once per tool
    first, other = tools[0].input_schema["$defs"], tools[77].input_schema["$defs"]
    assert set(first) == set(other) == {f"C{i}" for i in range(50)}  # each tool: what it reaches
    assert all(first[name] is other[name] for name in first)  # one converted schema, shared
    tools[77].validate({"body": {"name": "a", "next": {"next": {"name": "c"}}}})


def test_a_long_chain_of_components_loads() -> None:
    # Each component was converted inside the one referring to it, a few calls deeper each:
    # past a few hundred the document was "nested too deeply".
    document = _ring(1000, 1)
    document["components"]["schemas"]["C999"]["properties"].pop("next")  # a chain, not a ring
    (tool,) = OpenAPISource(document).tools()
    assert len(tool.input_schema["$defs"]) == 1000


def test_shared_component_schemas_are_changed_by_no_consumer() -> None:
    # Tools share their converted component schemas: whatever reads a tool's schema must leave
    # them as they are, or one tool's use would change the others'.
    components = {
        "Pet": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "default": "Rex"},
                "kind": {"$ref": "#/components/schemas/Kind"},
                "bad key!": {"type": "integer"},
            },
            "required": ["name"],
        },
        "Kind": {"type": "string", "enum": ["cat", "dog"], "nullable": True},
    }
    document = _with_body({"$ref": "#/components/schemas/Pet"}, {"schemas": components})
    document["paths"]["/y"] = {"put": {**document["paths"]["/x"]["post"], "operationId": "y"}}
    source = OpenAPISource(document)
    before = [json.dumps(t.input_schema) for t in source.tools()]
    kit = Toolkit()
    kit.add(source, prefix="pets")
    tools = kit.tools
    to_openai(tools, strict=True)
    to_openai(tools, strict=False, api="responses")
    to_anthropic(tools)
    to_gemini(tools)
    for tool in tools:
        tool.validate({"body": {"name": "a", "kind": None, "bad key!": 1}})
    assert [json.dumps(t.input_schema) for t in source.tools()] == before
