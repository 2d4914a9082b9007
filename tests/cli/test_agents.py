"""``toolmesh serve --a2a``, ``toolmesh agents add/list`` and ``--target CARD_URL``, run as users
run them, against a served agent whose model is a local stub."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli.test_cli import run
from tests.conftest import REPO, toolmesh_command
from tests.fixtures.llm_stub import StubLLM, openai_text
from toolmesh.cli import main

pytestmark = [pytest.mark.network_server]


@pytest.fixture(scope="module")
def agent_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    audit = tmp_path_factory.mktemp("agent") / "agent.db"
    with StubLLM(lambda body, i: openai_text("hello from the desk")) as llm:
        process = subprocess.Popen(
            toolmesh_command(
                "serve",
                "--http",
                "127.0.0.1:0",
                "--a2a",
                "desk",
                "--a2a-description",
                "Greets people.",
                "--llm",
                llm.base_url,
                "--model",
                "m",
                "--skills",
                "examples/skills",
                "--audit",
                str(audit),
            ),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:"), process.stderr
            yield url
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0


def test_serve_a2a_answers_as_an_agent(agent_url: str) -> None:
    card = httpx.get(agent_url + "/.well-known/agent-card.json").json()
    assert card["name"] == "desk" and card["description"] == "Greets people."
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": "m",
                "role": "user",
                "parts": [{"kind": "text", "text": "hi"}],
            }
        },
    }
    task = httpx.post(agent_url + "/a2a", json=request, timeout=30).json()["result"]
    assert task["status"]["state"] == "completed"
    assert task["artifacts"][0]["parts"][0]["text"] == "hello from the desk"


def test_tools_and_call_with_a_card_target(agent_url: str) -> None:
    card_url = agent_url + "/.well-known/agent-card.json"
    listed = run("tools", "--target", card_url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[0] == "desk_hello-world"
    called = run("call", "desk_hello-world", "--args", '{"task": "hi"}', "--target", card_url)
    assert called.returncode == 0, called.stderr
    result = json.loads(called.stdout)
    assert result["output"] == "hello from the desk"
    assert result["metadata"]["state"] == "completed"
    # audited where `serve` audits (TOOLMESH_AUDIT here), as every call made here is
    audit = sqlite3.connect(os.environ["TOOLMESH_AUDIT"])
    assert audit.execute("SELECT tool_name, success FROM audit").fetchall() == [
        ("desk_hello-world", 1)
    ]


def test_agents_add_and_list(agent_url: str, tmp_path: Path) -> None:
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text('[toolkit]\nname = "mine"\n')
    added = run(
        "agents",
        "add",
        agent_url,
        "--header",
        "Authorization: Bearer ${DESK_TOKEN}",
        "--config",
        str(manifest),
    )
    assert added.returncode == 2 and "DESK_TOKEN is not set" in added.stderr
    added = run("agents", "add", agent_url, "--config", str(manifest))
    assert added.returncode == 0, added.stderr
    assert "desk_hello-world" in added.stdout
    parsed = tomllib.loads(manifest.read_text())
    assert parsed["toolkit"]["name"] == "mine"
    assert parsed["agents"]["desk"]["card"] == agent_url + "/.well-known/agent-card.json"
    before = manifest.read_text()
    again = run("agents", "add", agent_url, "--config", str(manifest))
    assert again.returncode == 2 and "already has [agents.desk]" in again.stderr
    assert manifest.read_text() == before
    listed = run("agents", "list", "--config", str(manifest))
    assert listed.stdout.split() == ["desk", agent_url + "/.well-known/agent-card.json"]


def test_agents_add_an_unreachable_card(tmp_path: Path) -> None:
    failed = run("agents", "add", "http://127.0.0.1:9", "--config", str(tmp_path / "t.toml"))
    assert failed.returncode == 2 and "cannot fetch the agent card" in failed.stderr
    assert not (tmp_path / "t.toml").exists()


def test_serve_a2a_needs_a_model() -> None:
    refused = run("serve", "--http", "127.0.0.1:0", "--a2a", "desk", "--skills", "examples/skills")
    assert refused.returncode == 2 and "--llm BASE_URL and --model" in refused.stderr


def test_help() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "toolmesh", "agents", "add", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert shown.returncode == 0 and "CARD_URL" in shown.stdout


def test_agents_add_a_dotted_name_round_trips(agent_url: str, tmp_path: Path) -> None:
    # `[agents.a.b]` would nest b inside a; the key is quoted instead.
    manifest = tmp_path / "toolmesh.toml"
    added = run("agents", "add", agent_url, "--name", "a.b", "--config", str(manifest))
    assert added.returncode == 0, added.stderr
    assert '[agents."a.b"]' in added.stdout
    parsed = tomllib.loads(manifest.read_text())
    assert list(parsed["agents"]) == ["a.b"]
    assert parsed["agents"]["a.b"]["card"] == agent_url + "/.well-known/agent-card.json"
    listed = run("agents", "list", "--config", str(manifest))
    assert listed.stdout.split()[0] == "a.b"
    again = run("agents", "add", agent_url, "--name", "a.b", "--config", str(manifest))
    assert again.returncode == 2 and 'already has [agents."a.b"]' in again.stderr


@pytest.mark.parametrize("action", [["list"], ["add", "http://127.0.0.1:9"]])
def test_agents_that_is_not_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: list[str]
) -> None:
    manifest = tmp_path / "a1.toml"
    manifest.write_text("agents = 5\n")
    assert main(["agents", *action, "--config", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert err == f"toolmesh: error: {manifest}: agents: must be a table of agents ([agents.KEY])\n"
    assert manifest.read_text() == "agents = 5\n"


def test_agents_add_refuses_an_empty_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "toolmesh.toml"
    assert (
        main(["agents", "add", "http://127.0.0.1:9", "--name", "", "--config", str(manifest)]) == 2
    )
    assert "--name must not be empty" in capsys.readouterr().err
    assert not manifest.exists()


@contextlib.contextmanager
def served_agent(folder: Path, *extra: str, environment: dict[str, str]) -> Iterator[str]:
    """``toolmesh serve --http --a2a desk`` (a stub model) run in ``folder``: its URL, while
    it runs; it must stop cleanly on SIGTERM."""
    with StubLLM(lambda body, i: openai_text("unused")) as llm:
        process = subprocess.Popen(
            toolmesh_command(
                "serve",
                "--http",
                "127.0.0.1:0",
                "--a2a",
                "desk",
                "--llm",
                llm.base_url,
                "--model",
                "m",
                *extra,
            ),
            cwd=folder,
            env={**environment, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()  # printed once the store is open
            assert url.startswith("http://127.0.0.1:"), process.stderr
            yield url
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0


@pytest.mark.parametrize(
    ("extra", "expected"), [([], "from-manifest.db"), (["--audit", "given.db"], "given.db")]
)
def test_serve_a2a_uses_the_manifests_audit(
    tmp_path: Path, extra: list[str], expected: str
) -> None:
    # `serve --a2a --config` used to ignore [toolkit] audit and write ./toolmesh-audit.db.
    (tmp_path / "toolmesh.toml").write_text('[toolkit]\naudit = "from-manifest.db"\n')
    environment = {k: v for k, v in os.environ.items() if k != "TOOLMESH_AUDIT"}
    with served_agent(tmp_path, "--config", "toolmesh.toml", *extra, environment=environment):
        pass
    made = {p.name for p in tmp_path.iterdir()} - {"toolmesh.toml"}
    assert expected in made and "toolmesh-audit.db" not in made


def test_serve_a2a_with_mcp_serves_both(tmp_path: Path) -> None:
    audit = str(tmp_path / "a.db")
    with served_agent(tmp_path, "--mcp", "--audit", audit, environment=dict(os.environ)) as url:
        card = httpx.get(f"{url}/.well-known/agent-card.json", timeout=10)
        assert card.status_code == 200 and card.json()["name"] == "desk"
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}}
        hello["clientInfo"] = {"name": "t", "version": "1"}
        answer = httpx.post(
            f"{url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
            headers={"Accept": "application/json, text/event-stream"},
            timeout=10,
        )
        assert answer.status_code == 200 and "mcp-session-id" in answer.headers


def test_agents_list_shows_every_entry_though_one_needs_a_secret(tmp_path: Path) -> None:
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(
        '[agents.open]\ncard = "http://127.0.0.1:9/.well-known/agent-card.json"\n'
        '[agents.locked]\ncard = "http://127.0.0.1:8/.well-known/agent-card.json"\n'
        'headers = { Authorization = "Bearer ${QA_UNSET_TOKEN}" }\n'
    )
    listed = run("agents", "list", "--config", str(manifest))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == "open  http://127.0.0.1:9/.well-known/agent-card.json"
    assert lines[1].startswith("locked  http://127.0.0.1:8/.well-known/agent-card.json  (not")
    assert "QA_UNSET_TOKEN is not set" in lines[1]


def test_serve_a2a_takes_the_same_sources_and_limits_as_serve(tmp_path: Path) -> None:
    """`serve --a2a` ignored --mcp-config (and served the built-ins instead), --max-parallel,
    --max-message-bytes and --approval-timeout: it serves what plain `serve` would."""
    servers = tmp_path / "servers.json"
    time_server = {"command": sys.executable, "args": ["-m", "mcp_server_time"]}
    servers.write_text(json.dumps({"mcpServers": {"time": time_server}}))
    options = ["--mcp-config", str(servers), "--max-parallel", "3", "--max-message-bytes", "4096"]
    options += ["--audit", str(tmp_path / "a.db")]
    with served_agent(tmp_path, *options, environment=dict(os.environ)) as url:
        from toolmesh import ToolAPI, connect

        with connect(url, agent_id="t") as client:
            api = ToolAPI(client)
            names = {t.name for t in api.list()}
            assert {"time_get_current_time", "time_convert_time"} <= names
            assert "read_file" not in names  # not the built-ins
            assert client.max_parallel == 3
            now = api.call("time_get_current_time", {"timezone": "UTC"})
            assert now.success, now
        big = {"type": "ping", "id": "p", "pad": "x" * 5000}
        session = httpx.post(f"{url}/session", timeout=10).json()["session_id"]
        refused = httpx.post(
            f"{url}/send", content=json.dumps(big), headers={"X-Session-Id": session}, timeout=10
        )
        assert refused.status_code == 200
        with httpx.stream(
            "GET", f"{url}/stream", headers={"X-Session-Id": session}, timeout=10
        ) as stream:
            first = next(line for line in stream.iter_lines() if line.startswith("data:"))
        assert json.loads(first[5:])["code"] == "message_too_large"


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_agents_add_refuses_a_timeout_that_is_no_deadline(
    timeout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0 was taken as "not given" (300 s) and nan as a deadline."""
    manifest = tmp_path / "toolmesh.toml"
    with pytest.raises(SystemExit) as exited:
        main(
            ["agents", "add", "http://127.0.0.1:9", "--timeout", timeout, "--config", str(manifest)]
        )
    assert exited.value.code == 2
    assert f"wants a number of seconds above 0, not {timeout!r}" in capsys.readouterr().err
    assert not manifest.exists()
