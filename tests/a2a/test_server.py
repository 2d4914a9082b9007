"""A toolkit served as an A2A agent, driven by the real a2a-sdk 1.x client: the card,
SendMessage + GetTask, streaming, CancelTask, ListTasks, a restart, contextId, v0.3, errors."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig
from a2a.client import create_client as a2a_client
from a2a.client.card_resolver import parse_agent_card
from a2a.compat.v0_3 import types as v03
from a2a.helpers import new_text_part
from a2a.types import (
    CancelTaskRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import PushNotificationNotSupportedError, TaskNotCancelableError
from google.protobuf.json_format import ParseDict

from tests.conftest import REPO
from tests.fixtures.llm_stub import Answer, StubLLM, openai_calls, openai_text
from toolmesh import (
    ConfigError,
    Limits,
    Output,
    ToolContext,
    Toolkit,
    create_client,
    create_toolkit,
    tool,
)
from toolmesh.serving import ServeHandle
from toolmesh.store import MemoryStore, SqliteStore
from toolmesh.store.base import A2ATaskRecord

pytestmark = [pytest.mark.network_server]

SKILLS = REPO / "examples" / "skills"


@dataclass
class Served:
    kit: Toolkit
    handle: ServeHandle
    llm: StubLLM

    @property
    def rpc(self) -> str:
        return self.handle.url + "/a2a"


@pytest.fixture
def llm() -> Any:
    with StubLLM(lambda body, i: openai_text(f"answer {i}")) as stub:
        yield stub


async def serve(llm: StubLLM, audit: Path | None = None, **options: Any) -> Served:
    kit = await create_toolkit(skills_dir=SKILLS, audit=audit, name="desk-tools")
    client = create_client(llm.base_url, model="m")
    a2a = {"name": "desk", "description": "A helpful desk.", **options}
    handle = await kit.serve("127.0.0.1:0", client=client, a2a=a2a)
    return Served(kit, handle, llm)


@pytest.fixture
async def served(llm: StubLLM) -> AsyncIterator[Served]:
    running = await serve(llm)
    yield running
    await running.handle.stop()
    await running.kit.close()


@contextlib.asynccontextmanager
async def streaming_agent(tools: list[Any], answer: Any, name: str) -> AsyncIterator[Any]:
    """A toolkit of ``tools`` served as the A2A agent ``name`` over a stub model answering with
    ``answer``, and an a2a-sdk client of it that streams."""
    with StubLLM(answer) as stub:
        kit = await create_toolkit(tools=tools, skills_dir=SKILLS)
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a=name)
        client = await a2a_client(handle.url, ClientConfig(streaming=True))
        try:
            yield client
        finally:
            await client.close()
            await handle.stop()
            await kit.close()


def user_message(text: str, **fields: Any) -> Message:
    return Message(
        message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[new_text_part(text)], **fields
    )


async def rpc(url: str, method: str, params: Any, **headers: str) -> dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}
    async with httpx.AsyncClient() as http:
        answer = await http.post(url, json=request, headers=headers)
    assert answer.status_code == 200
    return dict(answer.json())


C = {"returnImmediately": "false"}  # a text, not a boolean: truthy, but it says the opposite
V03_HI = {
    "kind": "message",
    "messageId": "m",
    "role": "user",
    "parts": [{"kind": "text", "text": "hi"}],
}


def text_of(task: Any) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


async def test_the_card(served: Served) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.get(served.handle.url + "/.well-known/agent-card.json")
    card = answer.json()
    assert card["name"] == "desk" and card["description"] == "A helpful desk."
    assert card["supportedInterfaces"][0] == {
        "url": served.rpc,
        "protocolBinding": "JSONRPC",
        "protocolVersion": "1.0",
    }
    assert card["capabilities"]["streaming"] is True
    assert [s["id"] for s in card["skills"]] == ["hello-world"]  # skills, not raw tools
    parsed = parse_agent_card(dict(card))  # the SDK reads it as a 1.0 card
    assert parsed.skills[0].description.startswith("Greets the user")
    assert parsed.supported_interfaces[0].url == served.rpc


async def test_send_message_then_get_task(served: Served) -> None:
    client = await a2a_client(served.handle.url, ClientConfig(streaming=False))
    try:
        events = [
            e async for e in client.send_message(SendMessageRequest(message=user_message("hi")))
        ]
        [event] = events
        task = event.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert text_of(task) == "answer 0"
        fetched = await client.get_task(GetTaskRequest(id=task.id))
    finally:
        await client.close()
    assert fetched.status.state == TaskState.TASK_STATE_COMPLETED and text_of(fetched) == "answer 0"
    assert [m.role for m in fetched.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
    assert served.llm.requests[0].body["messages"][-1] == {"role": "user", "content": "hi"}


async def test_streaming(served: Served) -> None:
    client = await a2a_client(served.handle.url, ClientConfig(streaming=True))
    try:
        request = SendMessageRequest(message=user_message("stream please"))
        events: list[StreamResponse] = [e async for e in client.send_message(request)]
    finally:
        await client.close()
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds == ["task", "status_update", "artifact_update", "status_update"]
    assert events[1].status_update.status.state == TaskState.TASK_STATE_WORKING
    assert events[2].artifact_update.artifact.parts[0].text == "answer 0"
    assert events[3].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_tool_calls_stream_as_status_updates(llm: StubLLM) -> None:
    @tool
    def lookup(term: str) -> str:
        """Look a term up."""
        return f"{term} means yes"

    answers = [openai_calls(("c", "lookup", {"term": "ok"})), openai_text("it means yes")]
    async with streaming_agent([lookup], lambda body, i: answers[min(i, 1)], "desk") as client:
        request = SendMessageRequest(message=user_message("what does ok mean?"))
        events = [e async for e in client.send_message(request)]
    said = [
        e.status_update.status.message.parts[0].text
        for e in events
        if e.HasField("status_update") and e.status_update.status.message.parts
    ]
    assert said == ["calling lookup"]
    assert events[-2].artifact_update.artifact.parts[0].text == "it means yes"


async def test_a_subscriber_and_get_task_see_the_tool_a_task_calls() -> None:
    """Progress was recorded only when the task had a streaming listener as it started: a task
    sent with returnImmediately and then subscribed to never told its subscriber (nor GetTask)
    which tool it was calling."""
    subscribed, calling, finish = threading.Event(), asyncio.Event(), asyncio.Event()

    @tool
    async def lookup(term: str) -> str:
        """Look a term up."""
        calling.set()
        await finish.wait()
        return f"{term} means yes"

    def model(body: dict[str, Any], index: int) -> Answer:
        if index == 0:
            subscribed.wait(30)  # the model asks for the tool once the subscriber listens
            return openai_calls(("c", "lookup", {"term": "ok"}))
        return openai_text("it means yes")

    with StubLLM(model) as stub:
        kit = await create_toolkit(tools=[lookup], skills_dir=SKILLS)
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a="desk")
        url = handle.url + "/a2a"
        try:
            params = {
                "message": _wire_message("what is ok?"),
                "configuration": {"returnImmediately": True},
            }
            task_id = (await rpc(url, "SendMessage", params))["result"]["task"]["id"]
            subscribe = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "SubscribeToTask",
                "params": {"id": task_id},
            }
            async with (
                httpx.AsyncClient(timeout=10) as http,
                http.stream("POST", url, json=subscribe) as stream,
            ):
                events = _data_events(stream.aiter_lines())
                first = await anext(events)
                assert first["result"]["task"]["id"] == task_id
                subscribed.set()
                await calling.wait()
                polled = (await rpc(url, "GetTask", {"id": task_id}))["result"]["status"]
                finish.set()
                rest = [event["result"] async for event in events]
        finally:
            subscribed.set()
            finish.set()
            await handle.stop()
            await kit.close()
    assert polled["message"]["parts"][0]["text"] == "calling lookup"
    said = [
        u["statusUpdate"]["status"].get("message", {}).get("parts", [{}])[0].get("text")
        for u in rest
        if "statusUpdate" in u
    ]
    assert "calling lookup" in said
    assert rest[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def _data_events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC answers of an A2A event stream (one ``data:`` line each)."""
    async for line in lines:
        if line.startswith("data:"):
            yield json.loads(line[5:])


async def test_cancel_task() -> None:
    release = threading.Event()

    def slow(body: dict[str, Any], index: int) -> Answer:
        release.wait(30)
        return openai_text("too late")

    with StubLLM(slow) as stub:
        running = await serve(stub)
        client = await a2a_client(running.handle.url, ClientConfig(streaming=False))
        try:
            request = SendMessageRequest(
                message=user_message("take your time"),
                configuration=SendMessageConfiguration(return_immediately=True),
            )
            [event] = [e async for e in client.send_message(request)]
            assert event.task.status.state in (
                TaskState.TASK_STATE_SUBMITTED,
                TaskState.TASK_STATE_WORKING,
            )
            cancelled = await client.cancel_task(CancelTaskRequest(id=event.task.id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            fetched = await client.get_task(GetTaskRequest(id=event.task.id))
            assert fetched.status.state == TaskState.TASK_STATE_CANCELED
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=event.task.id))
        finally:
            release.set()
            await client.close()
            await running.handle.stop()
            await running.kit.close()


async def test_tasks_survive_a_restart_and_context_continues(llm: StubLLM, tmp_path: Path) -> None:
    audit = tmp_path / "desk.db"
    first = await serve(llm, audit)
    answer = await rpc(
        first.rpc,
        "SendMessage",
        {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "remember 42"}]}},
        **{"A2A-Version": "1.0"},
    )
    task = answer["result"]["task"]
    await first.handle.stop()
    await first.kit.close()

    second = await serve(llm, audit)
    try:
        client = await a2a_client(second.handle.url, ClientConfig(streaming=False))
        try:
            fetched = await client.get_task(GetTaskRequest(id=task["id"]))
            assert fetched.status.state == TaskState.TASK_STATE_COMPLETED
            assert text_of(fetched) == "answer 0"
            follow_up = SendMessageRequest(
                message=user_message("what number?", context_id=task["contextId"])
            )
            [event] = [e async for e in client.send_message(follow_up)]
            listed = await client.list_tasks(ListTasksRequest(context_id=task["contextId"]))
        finally:
            await client.close()
    finally:
        await second.handle.stop()
        await second.kit.close()
    assert event.task.context_id == task["contextId"]
    sent = [(m["role"], m["content"]) for m in llm.requests[1].body["messages"][1:]]
    assert sent == [("user", "remember 42"), ("assistant", "answer 0"), ("user", "what number?")]
    assert listed.total_size == 2 and {t.id for t in listed.tasks} == {task["id"], event.task.id}


async def test_v03_methods(served: Served) -> None:
    message = {
        "kind": "message",
        "messageId": "m",
        "role": "user",
        "parts": [{"kind": "text", "text": "old"}],
    }
    sent = await rpc(served.rpc, "message/send", {"message": message})
    task = sent["result"]
    assert task["kind"] == "task" and task["status"]["state"] == "completed"
    assert task["artifacts"][0]["parts"] == [{"kind": "text", "text": "answer 0"}]
    got = await rpc(served.rpc, "tasks/get", {"id": task["id"]})
    assert got["result"]["history"][0]["role"] == "user"
    refused = await rpc(served.rpc, "tasks/cancel", {"id": task["id"]})
    assert refused["error"]["code"] == -32002


async def test_the_chosen_skill_is_in_the_system_prompt(served: Served) -> None:
    params = {
        "message": {
            "messageId": "m",
            "role": "ROLE_USER",
            "parts": [{"text": "hello"}],
            "metadata": {"skillId": "hello-world"},
        }
    }
    await rpc(served.rpc, "SendMessage", params)
    system = served.llm.requests[0].body["messages"][0]["content"]
    assert "Follow the skill 'hello-world'" in system and "under 80 words" in system
    params["message"]["metadata"] = {"skillId": "no-such-skill"}
    rejected = await rpc(served.rpc, "SendMessage", params)
    status = rejected["result"]["task"]["status"]
    assert status["state"] == "TASK_STATE_REJECTED"
    assert "no skill 'no-such-skill'" in status["message"]["parts"][0]["text"]


async def test_a_rejected_streaming_message_ends_its_stream(served: Served) -> None:
    message = {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    message["metadata"] = {"skillId": "nope"}
    request = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "SendStreamingMessage",
        "params": {"message": message},
    }
    async with httpx.AsyncClient() as http:
        answer = await http.post(served.rpc, json=request, timeout=10)
    events = [json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:")]
    states = [
        (e["result"].get("task") or e["result"]["statusUpdate"])["status"]["state"] for e in events
    ]
    assert states == ["TASK_STATE_REJECTED", "TASK_STATE_REJECTED"]


@pytest.mark.parametrize(
    ("method", "params", "headers", "code"),
    [
        ("NoSuchMethod", {}, {}, -32601),
        ("GetTask", {"id": "missing"}, {}, -32001),
        ("GetTask", {}, {}, -32602),
        ("GetTask", {"id": "x"}, {"A2A-Version": "2.0"}, -32009),
        ("SendMessage", {"message": {"parts": []}}, {}, -32602),
        ("ListTasks", {"pageToken": "abc"}, {}, -32602),
        # what the card does not claim is refused with A2A's own errors, in both dialects
        ("CreateTaskPushNotificationConfig", {"taskId": "t", "url": "http://x/"}, {}, -32003),
        ("GetTaskPushNotificationConfig", {"taskId": "t", "id": "c"}, {}, -32003),
        ("ListTaskPushNotificationConfigs", {"taskId": "t"}, {}, -32003),
        ("DeleteTaskPushNotificationConfig", {"taskId": "t", "id": "c"}, {}, -32003),
        ("tasks/pushNotificationConfig/set", {"taskId": "t"}, {}, -32003),
        ("tasks/pushNotificationConfig/get", {"id": "t"}, {}, -32003),
        ("GetExtendedAgentCard", {}, {}, -32007),
        ("agent/getAuthenticatedExtendedCard", {}, {}, -32007),
        # parameters of the wrong value are refused, not read as something else
        ("GetTask", {"id": "x", "historyLength": -1}, {}, -32602),
        ("GetTask", {"id": "x", "historyLength": "all"}, {}, -32602),
        ("ListTasks", {"historyLength": -2}, {}, -32602),
        ("ListTasks", {"status": "TASK_STATE_DONE"}, {}, -32602),
        ("ListTasks", {"pageSize": True}, {}, -32602),
        ("ListTasks", {"pageSize": 0}, {}, -32602),  # given, not unset: the SDK refuses it too
        ("ListTasks", {"includeArtifacts": "yes"}, {}, -32602),
        ("ListTasks", {"statusTimestampAfter": "yesterday"}, {}, -32602),
        ("ListTasks", {"statusTimestampAfter": 1700000000}, {}, -32602),
        # as protobuf's Timestamp reads it: no date alone, no time without its offset
        ("ListTasks", {"statusTimestampAfter": "2024-01-01"}, {}, -32602),
        ("ListTasks", {"statusTimestampAfter": "2024-01-01T00:00:00"}, {}, -32602),
        ("ListTasks", {"statusTimestampAfter": "2024-01-01 00:00:00Z"}, {}, -32602),
        (
            "SendMessage",
            {"message": {"role": "ROLE_USER", "parts": [{"text": "hi"}]}, "configuration": C},
            {},
            -32602,
        ),
        # the v0.3 flag too: "false" was read as `not "false"`, a blocking send
        (
            "message/send",
            {"message": V03_HI, "configuration": {"blocking": "false"}},
            {},
            -32602,
        ),
        ("message/send", {"message": V03_HI, "configuration": {"blocking": 0}}, {}, -32602),
        # nothing the model could be given
        ("SendMessage", {"message": {"parts": [{"text": "  "}]}}, {}, -32602),
    ],
)
async def test_json_rpc_errors(
    served: Served, method: str, params: Any, headers: dict[str, str], code: int
) -> None:
    answer = await rpc(served.rpc, method, params, **headers)
    assert answer["error"]["code"] == code and answer["id"] == "r1", answer
    assert served.llm.requests == []  # no task was started by a refused request


async def test_the_sdk_reads_what_the_card_does_not_claim(served: Served) -> None:
    client = await a2a_client(served.handle.url, ClientConfig(streaming=False))
    try:
        config = TaskPushNotificationConfig(task_id="t", url="http://127.0.0.1:9/hook")
        with pytest.raises(PushNotificationNotSupportedError):
            await client.create_task_push_notification_config(config)
        with pytest.raises(PushNotificationNotSupportedError):
            await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id="t", id="c")
            )
    finally:
        await client.close()


async def test_list_tasks_filters_by_status_timestamp(served: Served) -> None:
    first = await rpc(served.rpc, "SendMessage", {"message": _wire_message("one")})
    stamp = first["result"]["task"]["status"]["timestamp"]  # when the first one completed
    second = await rpc(served.rpc, "SendMessage", {"message": _wire_message("two")})
    later = await rpc(served.rpc, "ListTasks", {"statusTimestampAfter": stamp})
    assert [t["id"] for t in later["result"]["tasks"]] == [second["result"]["task"]["id"]]
    assert later["result"]["totalSize"] == 1  # it used to be ignored: both were listed
    every = await rpc(served.rpc, "ListTasks", {"statusTimestampAfter": "2000-01-01T00:00:00Z"})
    assert every["result"]["totalSize"] == 2
    offset = {"statusTimestampAfter": "2000-01-01T00:00:00.123456789+02:00"}
    assert (await rpc(served.rpc, "ListTasks", offset))["result"]["totalSize"] == 2


async def test_history_length_cuts_the_history(served: Served) -> None:
    sent = await rpc(served.rpc, "SendMessage", {"message": _wire_message("hi")})
    task_id = sent["result"]["task"]["id"]
    whole = await rpc(served.rpc, "GetTask", {"id": task_id})
    last = await rpc(served.rpc, "GetTask", {"id": task_id, "historyLength": 1})
    none = await rpc(served.rpc, "GetTask", {"id": task_id, "historyLength": 0})
    assert len(whole["result"]["history"]) == 2
    assert last["result"]["history"] == whole["result"]["history"][-1:]
    assert "history" not in none["result"]


async def test_malformed_requests(served: Served) -> None:
    async with httpx.AsyncClient() as http:
        broken = await http.post(served.rpc, content=b"{nope")
        huge = b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": 1e999}}'
        infinite = await http.post(served.rpc, content=huge)
        batch = await http.post(served.rpc, json=[{"jsonrpc": "2.0", "method": "GetTask"}])
        foreign = await http.post(served.rpc, json={}, headers={"Origin": "https://evil.example"})
    assert broken.json()["error"]["code"] == -32700
    assert infinite.json()["error"]["code"] == -32700  # 1e999 would be infinity
    assert "1e999 is too large" in infinite.json()["error"]["message"]
    assert batch.json()["error"]["code"] == -32600
    assert foreign.status_code == 403


async def test_without_a2a_the_routes_are_404_and_a2e_shares_the_port(
    llm: StubLLM, served: Served
) -> None:
    kit = await create_toolkit(skills_dir=SKILLS)
    plain = await kit.serve()
    try:
        async with httpx.AsyncClient() as http:
            card = await http.get(plain.url + "/.well-known/agent-card.json")
            endpoint = await http.post(plain.url + "/a2a", json={})
            session = await http.post(served.handle.url + "/session")
    finally:
        await plain.stop()
        await kit.close()
    assert card.status_code == 404 and endpoint.status_code == 404
    assert session.status_code == 200 and session.json()["session_id"]


async def test_auth_token_guards_the_endpoint(llm: StubLLM) -> None:
    kit = await create_toolkit(skills_dir=SKILLS)
    client = create_client(llm.base_url, model="m")
    handle = await kit.serve(client=client, a2a="desk", auth_token="s3cret")
    try:
        async with httpx.AsyncClient() as http:
            card = (await http.get(handle.url + "/.well-known/agent-card.json")).json()
            refused = await http.post(handle.url + "/a2a", json={})
        allowed = await rpc(
            handle.url + "/a2a", "GetTask", {"id": "x"}, Authorization="Bearer s3cret"
        )
    finally:
        await handle.stop()
        await kit.close()
    assert "bearer" in card["securitySchemes"]
    assert refused.status_code == 401
    assert allowed["error"]["code"] == -32001
    # The card says it is read by v0.3 clients too (url, protocolVersion 0.3.0): its scheme was
    # read there as a mutualTLS scheme, and no security asked for
    scheme = v03.AgentCard.model_validate(card).security_schemes or {}
    assert isinstance(scheme["bearer"].root, v03.HTTPAuthSecurityScheme)
    assert scheme["bearer"].root.scheme.lower() == "bearer"
    assert v03.AgentCard.model_validate(card).security == [{"bearer": []}]
    parsed = parse_agent_card(json.loads(json.dumps(card)))  # (it changes what it reads)
    assert parsed.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert list(parsed.security_requirements[0].schemes) == ["bearer"]


async def test_serve_settings_are_checked(llm: StubLLM) -> None:
    kit = await create_toolkit(skills_dir=SKILLS)
    client = create_client(llm.base_url, model="m")
    try:
        with pytest.raises(ConfigError, match="needs client="):
            await kit.serve(a2a={"name": "x"})
        with pytest.raises(ConfigError, match="unknown settings colour"):
            await kit.serve(client=client, a2a={"name": "x", "colour": "red"})
        with pytest.raises(ConfigError, match="mcp= must be True or a mapping"):
            await kit.serve(mcp="yes please")
    finally:
        await kit.close()


async def test_serve_settings_without_a_name_name_the_agent_after_the_toolkit(
    llm: StubLLM,
) -> None:
    # a2a={...} without "name" raised TypeError (A2AServer's missing argument)
    kit = await create_toolkit(skills_dir=SKILLS, name="desk-tools")
    handle = await kit.serve(
        client=create_client(llm.base_url, model="m"), a2a={"description": "Helps."}
    )
    try:
        async with httpx.AsyncClient() as http:
            card = (await http.get(handle.url + "/.well-known/agent-card.json")).json()
        assert (card["name"], card["description"]) == ("desk-tools", "Helps.")
    finally:
        await handle.stop()
        await kit.close()


async def test_one_port_serves_a2e_a2a_and_mcp(llm: StubLLM) -> None:
    from mcp import Client

    @tool
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    kit = await create_toolkit(tools=[shout], skills_dir=SKILLS)
    handle = await kit.serve(client=create_client(llm.base_url, model="m"), a2a="desk", mcp=True)
    try:
        async with Client(handle.url + "/mcp") as mcp_client:
            answer = await mcp_client.call_tool("shout", {"text": "hi"})
            assert answer.content[0].text == "HI"
        async with httpx.AsyncClient() as http:
            card = (await http.get(handle.url + "/.well-known/agent-card.json")).json()
            assert card["name"] == "desk"
            assert (await http.post(handle.url + "/session")).status_code == 200
    finally:
        await handle.stop()
        await kit.close()


def test_the_sdk_parses_our_stream_items() -> None:
    item = {
        "statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}
    }
    assert ParseDict(item, StreamResponse()).status_update.task_id == "t"


async def test_a_call_needing_approval_waits_in_input_required() -> None:
    @tool(requires_approval=True)
    def transfer(amount: int) -> str:
        """Move money (a person approves each call)."""
        return f"moved {amount}"

    answers = [
        openai_calls(("c1", "transfer", {"amount": 5})),
        openai_text("done"),
        openai_calls(("c2", "transfer", {"amount": 9})),
        openai_text("refused, as you wished"),
    ]
    with StubLLM(lambda body, i: answers[min(i, 3)]) as stub:
        kit = await create_toolkit(tools=[transfer], skills_dir=SKILLS)
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a="bank")
        client = await a2a_client(handle.url, ClientConfig(streaming=False))
        try:
            first = [
                e
                async for e in client.send_message(
                    SendMessageRequest(message=user_message("pay 5"))
                )
            ]
            task = first[-1].task
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert "transfer" in task.status.message.parts[0].text
            approve = user_message("approve", task_id=task.id, context_id=task.context_id)
            done = [e async for e in client.send_message(SendMessageRequest(message=approve))]
            assert done[-1].task.status.state == TaskState.TASK_STATE_COMPLETED
            assert text_of(done[-1].task) == "done"

            second = [
                e
                async for e in client.send_message(
                    SendMessageRequest(message=user_message("pay 9"))
                )
            ]
            waiting = second[-1].task
            assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            unclear = user_message("maybe later", task_id=waiting.id, context_id=waiting.context_id)
            with pytest.raises(Exception, match="approve' or 'deny"):
                [e async for e in client.send_message(SendMessageRequest(message=unclear))]
            deny = user_message("deny", task_id=waiting.id, context_id=waiting.context_id)
            refused = [e async for e in client.send_message(SendMessageRequest(message=deny))]
            assert refused[-1].task.status.state == TaskState.TASK_STATE_COMPLETED
        finally:
            await client.close()
            await handle.stop()
            await kit.close()
    rows = [(e.tool_name, e.error_code, e.decision) for e in await kit.store.recent_audit()]
    assert ("transfer", None, "approval:approved") in rows
    assert ("transfer", "tool_denied", "approval:denied") in rows


@tool(requires_approval=True)
def deploy(target: str) -> str:
    """Deploy (a person approves each call)."""
    return f"deployed {target}"


async def test_a_stream_ends_where_the_task_waits_for_approval() -> None:
    answers = [openai_calls(("c1", "deploy", {"target": "prod"})), openai_text("deployed")]
    async with streaming_agent([deploy], lambda body, i: answers[min(i, 1)], "ops") as client:
        request = SendMessageRequest(message=user_message("deploy prod"))
        first = [e async for e in client.send_message(request)]  # ends: it waits for us
        states = [e.status_update.status.state for e in first if e.HasField("status_update")]
        assert states[-1] == TaskState.TASK_STATE_INPUT_REQUIRED
        waiting = first[-1].status_update
        approve = user_message("approve", task_id=waiting.task_id, context_id=waiting.context_id)
        rest = [e async for e in client.send_message(SendMessageRequest(message=approve))]
        final = [e.status_update.status.state for e in rest if e.HasField("status_update")]
        assert final[-1] == TaskState.TASK_STATE_COMPLETED


async def test_subscribing_to_a_task_that_waits_for_approval_ends_at_once() -> None:
    """Like a streamed message's, a subscription ends where the task waits for its caller:
    one Task event (input-required), then the end, not a stream held until someone answers."""
    with StubLLM(lambda body, i: openai_calls(("c1", "deploy", {"target": "prod"}))) as stub:
        kit = await create_toolkit(tools=[deploy], skills_dir=SKILLS)
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a="ops")
        try:
            sent = await rpc(handle.url + "/a2a", "SendMessage", {"message": _wire_message("go")})
            task = sent["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
            for method in ("SubscribeToTask", "tasks/resubscribe"):
                request = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": method,
                    "params": {"id": task["id"]},
                }
                async with httpx.AsyncClient(timeout=5) as http:
                    answer = await http.post(handle.url + "/a2a", json=request)
                events = [
                    json.loads(line[5:])
                    for line in answer.text.splitlines()
                    if line.startswith("data:")
                ]
                [event] = events
                shown = event["result"].get("task") or event["result"]
                assert shown["id"] == task["id"]
                assert shown["status"]["state"] in ("TASK_STATE_INPUT_REQUIRED", "input-required")
        finally:
            await handle.stop()
            await kit.close()


async def test_an_approval_lost_with_its_server_fails_the_task(tmp_path: Path) -> None:
    """What a killed server leaves in its store (a task waiting for approval) is failed when a
    new server reads it: a reply can no longer reach the call it was for."""
    with StubLLM(lambda body, i: openai_calls(("c1", "deploy", {"target": "prod"}))) as stub:
        kit = await create_toolkit(tools=[deploy], skills_dir=SKILLS, audit=tmp_path / "a.db")
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a="ops")
        answer = await rpc(handle.url + "/a2a", "SendMessage", {"message": _wire_message("go")})
        task = answer["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        left = await kit.store.load_a2a_task(task["id"])  # as a kill would leave it
        assert left is not None
        await handle.stop()
        await kit.close()
    crashed = SqliteStore(tmp_path / "b.db")
    await crashed.save_a2a_task(left)
    await crashed.close()
    with StubLLM(lambda body, i: openai_text("a new run")) as stub:
        kit = await create_toolkit(tools=[deploy], skills_dir=SKILLS, audit=tmp_path / "b.db")
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a="ops")
        try:
            got = await rpc(handle.url + "/a2a", "GetTask", {"id": task["id"]})
            status = got["result"]["status"]
            assert status["state"] == "TASK_STATE_FAILED"
            assert "'deploy' was waiting for approval" in status["message"]["parts"][0]["text"]
            reply = _wire_message("approve", taskId=task["id"], contextId=task["contextId"])
            refused = await rpc(handle.url + "/a2a", "SendMessage", {"message": reply})
            assert "error" in refused and "failed" in refused["error"]["message"]
            assert stub.requests == []  # no new run was started from the reply
        finally:
            await handle.stop()
            await kit.close()


@pytest.mark.parametrize(
    ("method", "params", "says"),
    [
        ("SendMessage", {"message": "M", "configuration": "blocking"}, "configuration must be"),
        ("SendMessage", {"message": "M", "metadata": [1, 2]}, "metadata must be an object"),
        ("SendMessage", {"message": "M+", "metadata": {}}, "message.metadata must be"),
        ("ListTasks", {"pageToken": "9" * 30}, "unknown pageToken"),
        ("ListTasks", {"contextId": []}, "contextId must be a string"),  # was: every task
        ("ListTasks", {"contextId": 5}, "contextId must be a string"),  # was: those of "5"
        ("message/send", {"message": "V03"}, "file must be an object"),
        ("message/send", {"message": "V03ok", "configuration": "x"}, "configuration must be"),
    ],
)
async def test_params_of_the_wrong_type_are_invalid_params(
    served: Served, method: str, params: dict[str, Any], says: str
) -> None:
    message = _wire_message("hello")
    if params.get("message") == "M+":
        message["metadata"] = "abc"
    if params.get("message") in ("V03", "V03ok"):
        message = {"messageId": "m", "role": "user", "kind": "message"}
        message["parts"] = [{"kind": "file", "file": "x"}]
        if params["message"] == "V03ok":
            message["parts"] = [{"kind": "text", "text": "hello"}]
    if "message" in params:
        params = {**params, "message": message}
    answer = await rpc(served.rpc, method, params)
    assert answer["error"]["code"] == -32602, answer
    assert says in answer["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"parts": [1, {"text": "hi"}]}, "message.parts[0] must be an object"),
        ({"parts": [{"text": "hi", "metadata": "x"}]}, "parts[0].metadata must be an object"),
        ({"parts": [{"text": "hi", "data": {}}]}, "more than one of text, raw, url, data"),
        ({"parts": [{"text": "hi"}, {"url": 5}]}, "message.parts[1].url must be a string"),
        ({"contextId": 5}, "message.contextId must be a string"),
        ({"referenceTaskIds": [1]}, "message.referenceTaskIds must be a list of strings"),
        ({"parts": [{"text": "hi"}, {"raw": "abcde"}]}, "message.parts[1].raw must be base64"),
    ],
)
async def test_a_malformed_message_is_refused_not_stored(
    served: Served, fields: dict[str, Any], says: str
) -> None:
    """Stored as sent, such a message made its task, and every ListTasks holding it,
    unreadable to the a2a-sdk client (its protobuf parsing fails on the bad part)."""
    message = {**_wire_message("hi"), **fields, "contextId": fields.get("contextId", "ctx-bad")}
    answer = await rpc(served.rpc, "SendMessage", {"message": message})
    assert answer["error"]["code"] == -32602 and says in answer["error"]["message"], answer
    assert served.llm.requests == []
    client = await a2a_client(served.handle.url, ClientConfig(streaming=False))
    try:
        listed = await client.list_tasks(ListTasksRequest(context_id="ctx-bad"))
    finally:
        await client.close()
    assert listed.total_size == 0


async def test_null_fields_of_a_message_are_fields_not_set(served: Served) -> None:
    """In the protobuf JSON mapping null is "not set": such a message was refused
    ("message.contextId must be a string, not None")."""
    message = {
        **_wire_message("hi"),
        "contextId": None,
        "taskId": None,
        "referenceTaskIds": None,
        "metadata": None,
    }
    message["parts"] = [{"text": "hi", "metadata": None, "mediaType": None}]
    answer = await rpc(served.rpc, "SendMessage", {"message": message})
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", answer
    assert task["contextId"]  # a new conversation, as for a message without one
    client = await a2a_client(served.handle.url, ClientConfig(streaming=False))
    try:  # what was stored reads back through the a2a-sdk's protobuf parsing
        listed = await client.list_tasks(ListTasksRequest(context_id=task["contextId"]))
    finally:
        await client.close()
    assert listed.total_size == 1
    sent = listed.tasks[0].history[0]
    assert sent.parts[0].text == "hi" and not sent.reference_task_ids


def _wire_message(text: str, **fields: Any) -> dict[str, Any]:
    return {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}], **fields}


_SDK_REQUESTS = {
    "GetTask": GetTaskRequest,
    "ListTasks": ListTasksRequest,
    "SendMessage": SendMessageRequest,
    "CancelTask": CancelTaskRequest,
}


def _sdk_parses(method: str, params: dict[str, Any]) -> bool:
    """Whether the a2a-sdk's protobuf parsing (the reference for what a peer may send) takes
    ``params`` as the request of ``method``."""
    try:
        ParseDict(params, _SDK_REQUESTS[method]())
    except Exception:
        return False
    return True


@pytest.mark.parametrize(
    ("method", "params", "expect"),
    [
        # int32 fields: the protobuf JSON mapping takes 1.0, "1", "1e0" as 1
        ("GetTask", {"historyLength": 1.0}, {"history": 1}),
        ("GetTask", {"historyLength": "1e0"}, {"history": 1}),
        ("GetTask", {"historyLength": 0.0}, {"history": 0}),
        ("ListTasks", {"pageSize": "1"}, {"listed": 1}),
        ("ListTasks", {"pageSize": 1.0}, {"listed": 1}),
        # enums by number: 3 is TASK_STATE_COMPLETED
        ("ListTasks", {"status": 3}, {"listed": 2}),
        ("ListTasks", {"status": "3"}, {"listed": 2}),
        ("ListTasks", {"status": 4}, {"listed": 0}),
        # fields by their proto names, which the mapping accepts as well as the JSON names
        ("GetTask", {"history_length": 1}, {"history": 1}),
        ("ListTasks", {"page_size": 1}, {"listed": 1}),
        ("ListTasks", {"context_id": "ctx-int-a"}, {"listed": 1}),
        ("ListTasks", {"include_artifacts": True}, {"artifacts": True}),
    ],
)
async def test_fields_are_read_as_the_protobuf_json_mapping_reads_them(
    served: Served, method: str, params: dict[str, Any], expect: dict[str, Any]
) -> None:
    """What the a2a-sdk's parser takes is taken: such values were refused ("historyLength must
    be a non-negative integer, not 1.0", "unknown task state 3") or ignored (a
    ``history_length`` or a ``context_id`` filter)."""
    first = await say(served.rpc, "one", "ctx-int-a")
    await say(served.rpc, "two", "ctx-int-b")
    if method == "GetTask":
        params = {"id": first["id"], **params}
    assert _sdk_parses(method, params)
    answer = await rpc(served.rpc, method, params)
    assert "result" in answer, answer
    result = answer["result"]
    if "history" in expect:
        assert len(result.get("history", [])) == expect["history"], result
    if "listed" in expect:
        assert len(result["tasks"]) == expect["listed"], result
    if "artifacts" in expect:
        assert all(("artifacts" in task) == expect["artifacts"] for task in result["tasks"])


@pytest.mark.parametrize(
    ("method", "params", "says"),
    [
        # str.isdigit() is true of "²", which int() refuses: that was a -32603 internal error
        ("GetTask", {"id": "x", "historyLength": "\u00b2"}, "historyLength must be"),
        ("ListTasks", {"historyLength": "\u00b2"}, "historyLength must be"),
        ("ListTasks", {"pageToken": "\u00b2"}, "unknown pageToken"),
        ("GetTask", {"id": "x", "historyLength": 1.5}, "historyLength must be"),
        ("GetTask", {"id": "x", "historyLength": 2**40}, "historyLength must be"),  # not int32
        ("ListTasks", {"pageSize": "ten"}, "pageSize must be"),
        ("ListTasks", {"pageSize": " 5"}, "pageSize must be"),
        ("ListTasks", {"status": 42}, "unknown task state"),
        ("CancelTask", {"id": "x", "metadata": [1]}, "metadata must be an object"),
        ("SendMessage", {"configuration": {"acceptedOutputModes": "text"}}, "acceptedOutputModes"),
        ("SendMessage", {"configuration": {"acceptedOutputModes": [None]}}, "acceptedOutputModes"),
        (
            "SendMessage",
            {"configuration": {"taskPushNotificationConfig": "http://x/"}},
            "configuration.taskPushNotificationConfig must be an object",
        ),
    ],
)
async def test_values_the_sdk_refuses_are_invalid_params_naming_the_field(
    served: Served, method: str, params: dict[str, Any], says: str
) -> None:
    if method == "SendMessage":
        params = {"message": _wire_message("hi"), **params}
    # any text parses as a pageToken (this server's tokens are offsets), and enums are open:
    # 42 parses, though no state has that number
    if "pageToken" not in params and params.get("status") != 42:
        assert not _sdk_parses(method, params)
    answer = await rpc(served.rpc, method, params)
    assert answer["error"]["code"] == -32602 and says in answer["error"]["message"], answer
    assert served.llm.requests == []


async def test_a_message_with_proto_field_names_and_a_role_number_is_read_as_sent(
    served: Served,
) -> None:
    """``context_id`` (the proto name of contextId) and ``"role": 1`` (ROLE_USER by number) are
    what the a2a-sdk's parser reads as such: the context was ignored (a new conversation was
    started, the message stored with both context_id and contextId) and the role refused."""
    first = await say(served.rpc, "remember 42", "ctx-proto")
    message = {"message_id": uuid.uuid4().hex, "role": 1, "context_id": "ctx-proto"}
    message["parts"] = [{"text": "what number?", "media_type": "text/plain"}]
    assert _sdk_parses("SendMessage", {"message": message})
    answer = await rpc(served.rpc, "SendMessage", {"message": message})
    task = answer["result"]["task"]
    assert task["contextId"] == "ctx-proto", answer
    assert task["history"][0]["messageId"] == message["message_id"]
    sent = served.llm.requests[1].body["messages"][1:]
    assert [m["content"] for m in sent] == ["remember 42", "answer 0", "what number?"]
    client = await a2a_client(served.handle.url, ClientConfig(streaming=False))
    try:  # stored under the JSON names, it reads back through the a2a-sdk's protobuf parsing
        listed = await client.list_tasks(ListTasksRequest(context_id="ctx-proto"))
    finally:
        await client.close()
    assert {t.id for t in listed.tasks} == {first["id"], task["id"]}
    [again] = [t for t in listed.tasks if t.id == task["id"]]
    assert again.history[0].role == Role.ROLE_USER
    assert again.history[0].parts[0].media_type == "text/plain"
    both = {**_wire_message("hi"), "contextId": "ctx-proto", "context_id": "ctx-other"}
    refused = await rpc(served.rpc, "SendMessage", {"message": both})
    assert refused["error"]["code"] == -32602, refused
    assert "both contextId and context_id" in refused["error"]["message"]


async def test_a_data_part_holding_null_is_a_data_part(served: Served) -> None:
    """``data`` is a google.protobuf.Value, for which null is a value: ``{"data": null}`` was
    dropped as a field not set, and the message refused as having no content."""
    message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"data": None}]}
    assert _sdk_parses("SendMessage", {"message": message})
    answer = await rpc(served.rpc, "SendMessage", {"message": message})
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", answer
    assert task["history"][0]["parts"] == [{"data": None}]
    assert served.llm.requests[0].body["messages"][-1] == {"role": "user", "content": "null"}
    client = await a2a_client(served.handle.url, ClientConfig(streaming=False))
    try:
        fetched = await client.get_task(GetTaskRequest(id=task["id"]))
    finally:
        await client.close()
    assert fetched.history[0].parts[0].HasField("data")


@pytest.mark.parametrize("policy", ["locked", "extensible"])
async def test_capabilities_are_enforced_and_overridable_per_message(policy: str) -> None:
    @tool(capabilities=["vault::read"])
    def vault() -> str:
        """Read the vault."""
        return "gold"

    answers = [openai_calls(("c", "vault", {})), openai_text("finished")]
    seen: list[Any] = []

    def reply(body: dict[str, Any], index: int) -> Answer:
        seen.append(body)
        return answers[index % 2]

    with StubLLM(reply) as stub:
        kit = await create_toolkit(
            tools=[vault],
            skills_dir=SKILLS,
            capabilities=["demo"],
            capability_policy=policy,  # type: ignore[arg-type]
        )
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a="vaulted")
        try:
            plain = await rpc(
                handle.url + "/a2a",
                "SendMessage",
                {
                    "message": {
                        "messageId": "m1",
                        "role": "ROLE_USER",
                        "parts": [{"text": "open it"}],
                    }
                },
            )
            assert plain["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            assert "vault" not in json.dumps(seen[0].get("tools", []))  # not listed to the model
            tool_answer = next(m for m in seen[1]["messages"] if m.get("role") == "tool")
            assert "requires capability 'vault::read'" in tool_answer["content"]
            extended = {
                "messageId": "m2",
                "role": "ROLE_USER",
                "parts": [{"text": "open it"}],
                "metadata": {
                    "toolmesh/capability_override": {
                        "strategy": "extend",
                        "capabilities": ["vault"],
                    }
                },
            }
            answer = await rpc(handle.url + "/a2a", "SendMessage", {"message": extended})
            if policy == "locked":
                assert "locked" in answer["error"]["message"]
            else:
                assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
                tool_answer = next(m for m in seen[3]["messages"] if m.get("role") == "tool")
                assert tool_answer["content"] == "gold"
        finally:
            await handle.stop()
            await kit.close()


async def test_a_running_task_is_listed_while_its_creator_waits() -> None:
    """A blocking SendMessage's task is first stored when it ends, but a listing finds it."""
    asked, release = threading.Event(), threading.Event()

    def slow(body: dict[str, Any], index: int) -> Answer:
        asked.set()
        release.wait(30)
        return openai_text("done now")

    with StubLLM(slow) as stub:
        running = await serve(stub)
        message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
        message["contextId"] = "ctx-1"
        headers = {"A2A-Version": "1.0"}
        try:
            waiting = asyncio.ensure_future(
                rpc(running.rpc, "SendMessage", {"message": message}, **headers)
            )
            assert await asyncio.to_thread(asked.wait, 30)
            listed = await rpc(running.rpc, "ListTasks", {"contextId": "ctx-1"}, **headers)
            [task] = listed["result"]["tasks"]
            assert task["status"]["state"] == "TASK_STATE_WORKING"
            release.set()
            answer = await waiting
            assert answer["result"]["task"]["id"] == task["id"]
            listed = await rpc(running.rpc, "ListTasks", {"contextId": "ctx-1"}, **headers)
            assert [t["status"]["state"] for t in listed["result"]["tasks"]] == [
                "TASK_STATE_COMPLETED"
            ]
        finally:
            release.set()
            await running.handle.stop()
            await running.kit.close()


class _HeldStore(MemoryStore):
    """A store that holds the write of a completed task until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.saving, self.release, self.saved = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def save_a2a_task(self, record: A2ATaskRecord) -> bool:
        if record.state == "completed":
            self.saving.set()
            await self.release.wait()
        written = await super().save_a2a_task(record)
        if record.state == "completed":
            self.saved.set()
        return written


async def test_a_cancel_while_the_task_is_being_recorded_as_completed(llm: StubLLM) -> None:
    """The task has completed and its end is being written: CancelTask answers -32002 (as for
    any completed task) and does not cut that write short, so the store keeps the end."""
    store = _HeldStore()
    running = await serve(llm, store=store)
    try:
        params = {"message": _wire_message("hi"), "configuration": {"returnImmediately": True}}
        sent = await rpc(running.rpc, "SendMessage", params)
        task_id = sent["result"]["task"]["id"]
        await asyncio.wait_for(store.saving.wait(), 10)
        refused = await rpc(running.rpc, "CancelTask", {"id": task_id})
        store.release.set()
        assert refused.get("error", {}).get("code") == -32002, refused
        await asyncio.wait_for(store.saved.wait(), 10)
        record = await store.load_a2a_task(task_id)
        assert record is not None and record.state == "completed"
    finally:
        store.release.set()
        await running.handle.stop()
        await running.kit.close()


@pytest.mark.parametrize("method", ["SendMessage", "message/send", "GetTask"])
async def test_a_request_without_an_id_is_refused_not_run(served: Served, method: str) -> None:
    """A JSON-RPC notification gets no answer, but A2A's methods have answers to give: it is an
    invalid request, and no task is started unseen (it was run and answered with id null)."""
    message = {**_wire_message("hi"), "contextId": "ctx-notified"}
    if method == "message/send":
        message = {**V03_HI, "contextId": "ctx-notified"}
    params = {"id": "x"} if method == "GetTask" else {"message": message}
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            served.rpc, json={"jsonrpc": "2.0", "method": method, "params": params}
        )
    body = answer.json()
    assert body["id"] is None and body["error"]["code"] == -32600, body
    assert "'id' is required" in body["error"]["message"]
    assert served.llm.requests == []
    listed = await rpc(served.rpc, "ListTasks", {"contextId": "ctx-notified"})
    assert listed["result"]["totalSize"] == 0
    kept = await rpc(served.rpc, "GetTask", {"id": "x"})  # an id, even null, is still answered
    assert kept["error"]["code"] == -32001


async def test_v03_blocking_null_is_not_said(served: Served) -> None:
    """``blocking: null`` is the default (wait), as the a2a-sdk's v0.3 model reads it; it was
    read as ``not None``, a send that returns at once."""
    params = {"message": V03_HI, "configuration": {"blocking": None}}
    answer = await rpc(served.rpc, "message/send", params)
    assert answer["result"]["status"]["state"] == "completed", answer


@pytest.mark.parametrize(
    ("part", "described"),
    [
        ({"raw": "aGVsbG8=", "mediaType": "text/plain"}, "[file: unnamed, text/plain, 5 bytes]"),
        ({"url": "https://files.example/r.pdf"}, "[file: https://files.example/r.pdf]"),
        (
            {"raw": "aGk=", "filename": "a.bin", "mediaType": "application/octet-stream"},
            "[file: a.bin, application/octet-stream, 2 bytes]",
        ),
    ],
)
async def test_a_message_of_only_a_file_is_described_to_the_model(
    served: Served, part: dict[str, Any], described: str
) -> None:
    """The model cannot read the bytes, but it is told what was sent (the message was refused
    as having "no text")."""
    message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [part]}
    answer = await rpc(served.rpc, "SendMessage", {"message": message})
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", answer
    assert answer["result"]["task"]["history"][0]["parts"] == [part]  # kept as sent
    asked = served.llm.requests[0].body["messages"][-1]
    assert asked == {"role": "user", "content": described}


async def test_a_streamed_approval_starts_with_the_task_as_it_stands() -> None:
    """The stream of the reply to an approval starts with the task working, its reply in its
    history, not the task as it was submitted (before it ever ran)."""
    answers = [openai_calls(("c1", "deploy", {"target": "prod"})), openai_text("deployed")]
    async with streaming_agent([deploy], lambda body, i: answers[min(i, 1)], "ops") as client:
        request = SendMessageRequest(message=user_message("deploy prod"))
        first = [e async for e in client.send_message(request)]
        waiting = first[-1].status_update
        assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        approve = user_message("approve", task_id=waiting.task_id, context_id=waiting.context_id)
        rest = [e async for e in client.send_message(SendMessageRequest(message=approve))]
    opening = rest[0].task
    assert opening.id == waiting.task_id
    assert opening.status.state == TaskState.TASK_STATE_WORKING
    assert [m.parts[0].text for m in opening.history] == ["deploy prod", "approve"]
    states = [e.status_update.status.state for e in rest if e.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED
    assert TaskState.TASK_STATE_SUBMITTED not in states


async def test_a_context_history_holds_only_answered_exchanges() -> None:
    """A new task of a context sees the completed exchanges of its other tasks, not a question
    another task is still working on or waits for approval over (the model answered those in
    the wrong task)."""
    asked, release = threading.Event(), threading.Event()

    def reply(body: dict[str, Any], index: int) -> Answer:
        question = body["messages"][-1]["content"]
        if question == "slow question":
            asked.set()
            release.wait(30)
        if question == "deploy it":
            return openai_calls(("c1", "deploy", {"target": "prod"}))
        return openai_text(f"answer to {question}")

    with StubLLM(reply) as stub:
        kit = await create_toolkit(tools=[deploy], skills_dir=SKILLS)
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a="ops")
        url = handle.url + "/a2a"
        context = {"contextId": "ctx-shared"}
        try:
            done = await rpc(
                url, "SendMessage", {"message": _wire_message("remember 42", **context)}
            )
            assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            paused = await rpc(
                url, "SendMessage", {"message": _wire_message("deploy it", **context)}
            )
            assert paused["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
            slow = {"message": _wire_message("slow question", **context)}
            slow["configuration"] = {"returnImmediately": True}
            await rpc(url, "SendMessage", slow)
            assert await asyncio.to_thread(asked.wait, 30)
            await rpc(url, "SendMessage", {"message": _wire_message("and now?", **context)})
            release.set()
        finally:
            release.set()
            await handle.stop()
            await kit.close()
    now = next(r.body for r in stub.requests if r.body["messages"][-1]["content"] == "and now?")
    sent = [(m["role"], m["content"]) for m in now["messages"][1:]]
    assert sent == [
        ("user", "remember 42"),
        ("assistant", "answer to remember 42"),
        ("user", "and now?"),
    ]


async def test_a_task_cut_off_by_max_turns_is_failed_not_completed() -> None:
    """A model still calling tools when the agent's max_turns runs out gave no answer: the task
    used to be "completed" with an empty response artifact."""

    @tool
    def lookup(term: str) -> str:
        """Look a term up."""
        return f"{term}: see also {term}"

    def forever(body: dict[str, Any], index: int) -> Answer:
        return openai_calls((f"c{index}", "lookup", {"term": "loop"}))

    with StubLLM(forever) as stub:
        kit = await create_toolkit(tools=[lookup])
        client = create_client(stub.base_url, model="m")
        handle = await kit.serve(client=client, a2a={"name": "desk", "max_turns": 2})
        try:
            answer = await rpc(handle.url + "/a2a", "SendMessage", {"message": _wire_message("go")})
        finally:
            await handle.stop()
            await kit.close()
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert "max_turns" in task["status"]["message"]["parts"][0]["text"]
    assert "artifacts" not in task
    assert len(stub.requests) == 2


async def test_a_failed_run_tells_the_caller_what_failed_not_the_details(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The provider's own error text (which may echo a credential) and the model's URL stay in
    the agent's log; the remote caller learns that the model provider failed, and its status."""

    def refuse(body: dict[str, Any], index: int) -> Answer:
        return Answer({"error": {"message": "bad key sk-secret-123"}}, status=401)

    with StubLLM(refuse) as stub:
        kit = await create_toolkit(tools=[])
        client = create_client(stub.base_url, model="m")
        handle = await kit.serve(client=client, a2a={"name": "desk"})
        try:
            with caplog.at_level(logging.WARNING, logger="toolmesh.a2a.server"):
                answer = await rpc(
                    handle.url + "/a2a", "SendMessage", {"message": _wire_message("go")}
                )
        finally:
            await handle.stop()
            await kit.close()
    task = answer["result"]["task"]
    said = task["status"]["message"]["parts"][0]["text"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert (
        said
        == "the agent's model provider failed (it answered HTTP 401); the agent's log has the details"
    )
    assert "sk-secret" not in json.dumps(answer) and stub.base_url not in json.dumps(answer)
    assert any("sk-secret-123" in record.getMessage() for record in caplog.records)


async def test_each_conversation_has_its_own_tool_state() -> None:
    """A tool's state belongs to the A2A conversation (contextId) that called it: a later task of
    the same conversation sees it, another conversation does not."""

    @tool
    def remember(word: str) -> Output:
        """Remember a word."""
        return Output("kept", state_update=[{"op": "add", "path": "/context/word", "value": word}])

    @tool
    def recall(ctx: ToolContext) -> str:
        """The word remembered, if any."""
        return str(ctx.state["context"].get("word", "nothing"))

    script = [
        openai_calls(("c1", "remember", {"word": "apple"})),
        openai_text("noted"),
        openai_calls(("c2", "recall", {})),
        openai_text("done"),
        openai_calls(("c3", "recall", {})),
        openai_text("done"),
    ]
    seen: list[dict[str, Any]] = []

    def reply(body: dict[str, Any], index: int) -> Answer:
        seen.append(body)
        return script[index]

    with StubLLM(reply) as stub:
        kit = await create_toolkit(tools=[remember, recall], skills_dir=SKILLS)
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a="keeper")
        try:
            for n, context in enumerate(["ctx-a", "ctx-b", "ctx-a"]):
                message = {
                    "messageId": f"m{n}",
                    "role": "ROLE_USER",
                    "parts": [{"text": "go"}],
                    "contextId": context,
                }
                answer = await rpc(handle.url + "/a2a", "SendMessage", {"message": message})
                assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        finally:
            await handle.stop()
            await kit.close()

    def tool_answer(body: dict[str, Any]) -> str:
        return str([m for m in body["messages"] if m.get("role") == "tool"][-1]["content"])

    assert tool_answer(seen[1]) == "kept"
    assert tool_answer(seen[3]) == "nothing"  # ctx-b: none of ctx-a's state
    assert tool_answer(seen[5]) == "apple"  # ctx-a again: its own state


# -- conversations: their sessions, state, approvals and audit -------------------------------------


@tool
def note(word: str) -> Output:
    """Note a word in the conversation's state."""
    return Output("noted", state_update=[{"op": "add", "path": f"/context/{word}", "value": 1}])


@tool
def notes(ctx: ToolContext) -> str:
    """The words noted in this conversation."""
    return ",".join(sorted(ctx.state["context"])) or "none"


def _conversation_model(body: dict[str, Any], index: int) -> Answer:
    """The model of these tests: "note WORD" calls note, "slow WORD" slow_note, "deploy A B"
    (or "release A B") that tool once per target in one turn, anything else notes; the tools'
    answers are said back."""
    last = body["messages"][-1]
    if last.get("role") == "tool":
        said = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
        return openai_text("tool said " + " | ".join(said))
    words = last["content"].split()
    if words[0] in ("note", "slow"):
        return openai_calls(
            ("c1", "slow_note" if words[0] == "slow" else "note", {"word": words[1]})
        )
    if words[0] in ("deploy", "release"):  # one call per target, in one turn
        calls = [(f"c{n}", words[0], {"target": t}) for n, t in enumerate(words[1:])]
        return openai_calls(*calls)
    return openai_calls(("c1", "notes", {}))


@contextlib.asynccontextmanager
async def conversation_agent(tools: list[Any], **kit_options: Any) -> AsyncIterator[Served]:
    with StubLLM(_conversation_model) as stub:
        kit = await create_toolkit(tools=tools, **kit_options)
        handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a="keeper")
        try:
            yield Served(kit, handle, stub)
        finally:
            await handle.stop()
            await kit.close()


async def say(url: str, text: str, context_id: str, **config: Any) -> dict[str, Any]:
    """The task a message in conversation ``context_id`` makes (as SendMessage answers it)."""
    params: dict[str, Any] = {"message": _wire_message(text, contextId=context_id)}
    if config:
        params["configuration"] = config
    answer = await rpc(url, "SendMessage", params)
    assert "result" in answer, answer
    return dict(answer["result"]["task"])


def job_of(board: Any, task_id: str) -> asyncio.Future[None]:
    """The job of a task running on ``board`` (an A2AServer's)."""
    job = board.running[task_id].job
    assert isinstance(job, asyncio.Future)
    return job


def answer_of(task: dict[str, Any]) -> str:
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]
    return str(task["artifacts"][0]["parts"][0]["text"])


def _session(context_id: str) -> str:
    """The session id docs/a2a.md gives a conversation."""
    plain = all(c.isascii() and (c.isalnum() or c in "._:-") for c in context_id)
    if plain and 0 < len(context_id) <= 128:
        return f"a2a:{context_id}"
    return "a2a:~" + hashlib.sha256(context_id.encode()).hexdigest()[:32]


async def test_every_context_id_has_a_session_of_its_own() -> None:
    """Long, odd, empty and plain contextIds each get their own session (state, audit). A long
    contextId's session was ``a2a:`` and 32 hex digits of its digest, which is also the session
    of the plain contextId spelling those digits: that conversation read and wrote the other's
    state."""
    long_id = "a conversation " + "x" * 300
    digest = hashlib.sha256(long_id.encode()).hexdigest()[:32]
    contexts = [long_id, digest, "", "with space", "é", "plain.ctx:1-2_3", "a" * 128, "a" * 129]
    async with conversation_agent([note, notes]) as agent:
        given = [
            (await say(agent.rpc, f"note w{n}", c))["contextId"] for n, c in enumerate(contexts)
        ]
        assert given[2] and given[2] not in contexts  # an empty contextId: a new conversation
        for n, context in enumerate(given):
            assert answer_of(await say(agent.rpc, "notes", context)) == f"tool said w{n}", n
        rows = await agent.kit.store.recent_audit(100)
    sessions = {(e.tool_name, e.session_id) for e in rows}
    assert sessions == {(name, _session(c)) for c in given for name in ("note", "notes")}
    assert _session(long_id).startswith("a2a:~") and len(_session(long_id)) == 37


async def test_a_conversations_calls_are_audited_as_a2a_calls(tmp_path: Path) -> None:
    """The calls a remote A2A client's task makes were audited with transport "inprocess" (and
    so committed lazily, as an in-process caller's that shares the host's fate)."""
    async with conversation_agent([note, notes], audit=tmp_path / "audit.db") as agent:
        assert answer_of(await say(agent.rpc, "note kiwi", "ctx-audit")) == "tool said noted"
        rows = await agent.kit.store.recent_audit()
        host_id = agent.handle.host.host_id
    assert [(e.tool_name, e.session_id, e.transport) for e in rows] == [
        ("note", "a2a:ctx-audit", "a2a")
    ]
    assert rows[0].host_id == host_id  # which host made the call (in a cluster)


async def test_two_tasks_of_one_conversation_keep_both_updates_then_release_its_state() -> None:
    """Two tasks of one contextId update its state at once: both updates are kept, both are
    audited under the conversation's session, and the host's cached copy of that state stays
    while either runs and goes when the last one ends (also over many conversations)."""
    gates = {"first": asyncio.Event(), "second": asyncio.Event()}
    entered = {"first": asyncio.Event(), "second": asyncio.Event()}

    @tool
    async def slow_note(word: str) -> Output:
        """Note a word once the test lets it."""
        entered[word].set()
        await gates[word].wait()
        return Output("noted", state_update=[{"op": "add", "path": f"/context/{word}", "value": 1}])

    async with conversation_agent([slow_note, note, notes]) as agent:
        board = agent.handle.a2a.board  # type: ignore[union-attr]
        first = await say(agent.rpc, "slow first", "ctx-both", returnImmediately=True)
        second = await say(agent.rpc, "slow second", "ctx-both", returnImmediately=True)
        await entered["first"].wait()
        await entered["second"].wait()
        jobs = {task["id"]: job_of(board, task["id"]) for task in (first, second)}
        gates["second"].set()
        await jobs[second["id"]]
        assert agent.kit.state.cached("a2a:ctx-both") == {"context": {"second": 1}}  # first runs
        gates["first"].set()
        await jobs[first["id"]]
        assert agent.kit.state.cached("a2a:ctx-both") is None
        assert answer_of(await say(agent.rpc, "notes", "ctx-both")) == "tool said first,second"
        for n in range(20):
            await say(agent.rpc, "note w", f"ctx-many-{n}")
        assert all(agent.kit.state.cached(f"a2a:ctx-many-{n}") is None for n in range(20))
        assert board.running == {}
        rows = await agent.kit.store.recent_audit(100)
    slow = [(e.session_id, e.success) for e in rows if e.tool_name == "slow_note"]
    assert slow == [("a2a:ctx-both", True)] * 2


async def test_cancelling_a_task_cancels_its_tool_and_the_conversation_goes_on() -> None:
    """CancelTask while a tool runs: the tool is cancelled, its call audited as cancelled in the
    conversation's session, and the conversation's next task works with its state."""
    entered, stopped = asyncio.Event(), asyncio.Event()

    @tool
    async def slow_note(word: str) -> Output:
        """Note a word, after a long while."""
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise
        return Output("noted", state_update=[{"op": "add", "path": f"/context/{word}", "value": 1}])

    async with conversation_agent([slow_note, note, notes]) as agent:
        assert answer_of(await say(agent.rpc, "note kept", "ctx-cancel")) == "tool said noted"
        task = await say(agent.rpc, "slow lost", "ctx-cancel", returnImmediately=True)
        await entered.wait()
        cancelled = await rpc(agent.rpc, "CancelTask", {"id": task["id"]})
        assert cancelled["result"]["status"]["state"] == "TASK_STATE_CANCELED"
        await asyncio.wait_for(stopped.wait(), 10)
        assert answer_of(await say(agent.rpc, "notes", "ctx-cancel")) == "tool said kept"
        assert agent.kit.state.cached("a2a:ctx-cancel") is None
        rows = await agent.kit.store.recent_audit(100)
    calls = [(e.tool_name, e.error_code, e.session_id) for e in reversed(rows)]
    assert calls == [
        ("note", None, "a2a:ctx-cancel"),
        ("slow_note", "cancelled", "a2a:ctx-cancel"),
        ("notes", None, "a2a:ctx-cancel"),
    ]


async def test_a_conversations_state_survives_a_restart_with_its_own_task_store(
    tmp_path: Path,
) -> None:
    """Tasks in ``a2a={"store": ...}``, tool state in the toolkit's own audit file: after a
    restart the conversation goes on with its history and its tools' state."""
    options = {"name": "keeper", "store": str(tmp_path / "tasks.db")}
    with StubLLM(_conversation_model) as stub:
        for text in ("note kiwi", "notes"):
            kit = await create_toolkit(tools=[note, notes], audit=tmp_path / "audit.db")
            handle = await kit.serve(client=create_client(stub.base_url, model="m"), a2a=options)
            try:
                task = await say(handle.url + "/a2a", text, "ctx-restart")
                listed = await rpc(handle.url + "/a2a", "ListTasks", {"contextId": "ctx-restart"})
            finally:
                await handle.stop()
                await kit.close()
    assert answer_of(task) == "tool said kiwi"
    assert listed["result"]["totalSize"] == 2
    asked = stub.requests[-2].body["messages"]  # the second server's first request
    assert [m["content"] for m in asked if m["role"] == "user"] == ["note kiwi", "notes"]
    audit = SqliteStore(tmp_path / "audit.db")
    try:
        rows = await audit.recent_audit()
    finally:
        await audit.close()
    assert [(e.tool_name, e.session_id) for e in rows] == [
        ("notes", "a2a:ctx-restart"),
        ("note", "a2a:ctx-restart"),
    ]


@tool(requires_approval=True)
def release(target: str) -> Output:
    """Release a target (a person approves each call); noted in the conversation's state."""
    return Output(
        f"released {target}",
        state_update=[{"op": "add", "path": f"/context/{target}", "value": 1}],
    )


async def test_two_approvals_of_one_turn_are_asked_one_after_another() -> None:
    """The model asks for two calls needing approval in one turn. The second's request replaced
    the first's: the task showed one approval, and once it was answered the other waited,
    unseen, until the approval timeout (300 s), the reply's SendMessage with it."""
    async with conversation_agent([deploy, notes]) as agent:
        task = await say(agent.rpc, "deploy eu us", "ctx-two")
        assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert task["status"]["message"]["metadata"]["approval"]["arguments"] == {"target": "eu"}
        reply = {"message": _wire_message("approve", taskId=task["id"], contextId="ctx-two")}
        answered = (await rpc(agent.rpc, "SendMessage", reply))["result"]["task"]
        assert answered["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"  # the next one
        assert answered["status"]["message"]["metadata"]["approval"]["arguments"] == {
            "target": "us"
        }
        reply = {"message": _wire_message("deny", taskId=task["id"])}
        done = (await rpc(agent.rpc, "SendMessage", reply))["result"]["task"]
        assert answer_of(done).startswith("tool said deployed eu | Error [tool_denied]")
        rows = await agent.kit.store.recent_audit()
    assert sorted((e.decision, e.session_id) for e in rows) == [
        ("approval:approved", "a2a:ctx-two"),
        ("approval:denied", "a2a:ctx-two"),
    ]


async def test_the_second_approval_of_a_turn_has_its_full_time_once_shown() -> None:
    """The second approval's timeout ran from when its call asked, while the first was
    shown: answering the first late left the second less than the approval timeout."""
    async with conversation_agent([deploy, notes], limits=Limits(approval_timeout=1.0)) as agent:
        task = await say(agent.rpc, "deploy eu us", "ctx-late")
        assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        await asyncio.sleep(0.6)  # a slow human's time, not a synchronisation
        reply = {"message": _wire_message("approve", taskId=task["id"], contextId="ctx-late")}
        answered = (await rpc(agent.rpc, "SendMessage", reply))["result"]["task"]
        assert answered["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"  # the second, shown
        await asyncio.sleep(0.6)  # past a second since it asked, within one since it showed
        done = (await rpc(agent.rpc, "SendMessage", reply))["result"]["task"]
    assert answer_of(done) == "tool said deployed eu | deployed us"


async def test_a_reply_naming_another_conversation_is_refused() -> None:
    """A task waits for an approval in one conversation. A message naming the task and another
    contextId is invalid (A2A: an agent rejects a contextId that is not its task's); it
    answered the approval, and the approved call ran in the task's conversation. A message in
    the other conversation without a taskId is a task of its own there."""
    async with conversation_agent([release, notes]) as agent:
        task = await say(agent.rpc, "release prod", "ctx-mine")
        assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        stray = _wire_message("approve", taskId=task["id"], contextId="ctx-other")
        refused = await rpc(agent.rpc, "SendMessage", {"message": stray})
        assert refused.get("error", {}).get("code") == -32602, refused
        assert "contextId" in refused["error"]["message"]
        still = (await rpc(agent.rpc, "GetTask", {"id": task["id"]}))["result"]
        assert still["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert [m["parts"][0]["text"] for m in still["history"]] == ["release prod"]
        elsewhere = await say(agent.rpc, "notes", "ctx-other")
        assert answer_of(elsewhere) == "tool said none"
        reply = _wire_message("approve", taskId=task["id"], contextId="ctx-mine")
        done = (await rpc(agent.rpc, "SendMessage", {"message": reply}))["result"]["task"]
        assert answer_of(done) == "tool said released prod"
        assert answer_of(await say(agent.rpc, "notes", "ctx-mine")) == "tool said prod"
        assert answer_of(await say(agent.rpc, "notes", "ctx-other")) == "tool said none"
        rows = await agent.kit.store.recent_audit()
    assert ("release", "a2a:ctx-mine", "approval:approved") in {
        (e.tool_name, e.session_id, e.decision) for e in rows
    }
