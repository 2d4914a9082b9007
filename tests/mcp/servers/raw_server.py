"""A hand-written stdio MCP server (JSON-RPC lines, 2025 handshake) that misbehaves on purpose,
for what the SDK's own server API would never send. Run as a script:

python raw_server.py malformed   # tools/list with malformed entries
python raw_server.py blank_names # tools/list with names "" and "  " (the SDK accepts them)
python raw_server.py blank_names_and_a_bad_schema  # the same and an entry the SDK refuses
python raw_server.py calls      # a clean listing, odd call results and progress values
python raw_server.py cursor      # tools/list answers with nextCursor "" (meaning: no more)
python raw_server.py answers     # a banner on stdout, then calls answered with broken envelopes
python raw_server.py structured  # tools with an outputSchema, answering what the call asks for
python raw_server.py deaf        # calling `deaf` makes it stop reading its stdin for good
python raw_server.py cycles      # tools whose schemas are $ref cycles (S = allOf[T], T = allOf[S])
python raw_server.py cycles_later  # a clean listing; calling `grow` lists a tool with a cycle
"""

import json
import sys
import threading
from typing import Any

MODE = sys.argv[1]
OBJECT = {"type": "object"}
COUNT = {  # `format` is an annotation only, as the SDK's client reads output schemas
    "type": "object",
    "properties": {"n": {"type": "integer"}, "mail": {"type": "string", "format": "email"}},
    "required": ["n"],
}
PAIR = {  # prefixItems: a JSON Schema 2020-12 keyword
    "type": "object",
    "properties": {"pair": {"type": "array", "prefixItems": [{"type": "integer"}]}},
}
# $ref cycles that never reach a schema: a validator (or a converter) follows them forever
ALL_OF_CYCLE = {
    "type": "object",
    "properties": {"q": {"$ref": "#/$defs/S"}},
    "$defs": {"S": {"allOf": [{"$ref": "#/$defs/T"}]}, "T": {"allOf": [{"$ref": "#/$defs/S"}]}},
}
ANY_OF_CYCLE = {
    "type": "object",
    "properties": {"q": {"anyOf": [{"$ref": "#/$defs/U"}, {"type": "null"}]}},
    "$defs": {"U": {"oneOf": [{"$ref": "#/$defs/V"}]}, "V": {"anyOf": [{"$ref": "#/$defs/U"}]}},
}
GROWN = [False]  # `grow` was called: the listing has one more tool
STRUCTURED = {  # what the `count` and `pair` tools answer, by the call's `send` argument
    "good": {"n": 3, "mail": "not an address"},
    "wrong": {"n": "three"},
    "pair": {"pair": ["one"]},
}


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def listing() -> dict[str, Any]:
    if MODE == "calls":
        return {"tools": [{"name": n, "inputSchema": OBJECT} for n in ("video", "good")]}
    if MODE == "cursor":
        return {"tools": [{"name": "list_requests", "inputSchema": OBJECT}], "nextCursor": ""}
    if MODE == "deaf":
        return {"tools": [{"name": n, "inputSchema": OBJECT} for n in ("deaf", "echo")]}
    if MODE == "structured":
        return {
            "tools": [
                {"name": "count", "inputSchema": OBJECT, "outputSchema": COUNT},
                {"name": "pair", "inputSchema": OBJECT, "outputSchema": PAIR},
            ]
        }
    if MODE.startswith("blank_names"):
        tools = [{"name": n, "inputSchema": OBJECT} for n in ("", " \t", "good")]
        if MODE.endswith("bad_schema"):
            tools.append({"name": "no_schema"})  # no inputSchema: the SDK refuses the listing
        return {"tools": tools}
    if MODE.startswith("cycles"):
        tools = [{"name": n, "inputSchema": OBJECT} for n in ("fine", "grow")]
        if MODE == "cycles":
            tools.append({"name": "cyc", "inputSchema": ALL_OF_CYCLE})
            tools.append(
                {"name": "cyc_output", "inputSchema": OBJECT, "outputSchema": ANY_OF_CYCLE}
            )
        if GROWN[0]:
            tools.append({"name": "later", "inputSchema": ANY_OF_CYCLE})
        return {"tools": tools}
    if MODE == "answers":
        names = ("text_result", "bad_error", "no_version", "good")
        return {"tools": [{"name": n, "inputSchema": OBJECT} for n in names]}
    return {
        "tools": [
            {"name": "no_schema"},  # inputSchema is required by the spec
            {"name": "string_schema", "inputSchema": {"type": "string"}},
            {"name": "bad_hints", "inputSchema": OBJECT, "annotations": {"title": 5}},
            {"name": "bad_output", "inputSchema": OBJECT, "outputSchema": {"type": "string"}},
            {"name": 5, "inputSchema": OBJECT},  # no usable name: left out
            {"name": "twice", "inputSchema": OBJECT, "description": "first"},
            {"name": "twice", "inputSchema": OBJECT, "description": "second"},
            {"name": "good", "inputSchema": OBJECT},
        ]
    }


def call(params: dict[str, Any]) -> dict[str, Any]:
    name = params["name"]
    token = (params.get("_meta") or {}).get("progressToken")
    if name == "good" and token is not None:
        for progress, total in [(1e300, 1e-300), (-1e300, 1e-300), (1, None)]:
            update = {"progressToken": token, "progress": progress}
            if total is not None:
                update["total"] = total
            send({"jsonrpc": "2.0", "method": "notifications/progress", "params": update})
    if MODE == "structured":
        send_back = (params.get("arguments") or {}).get("send")
        result: dict[str, Any] = {"content": [{"type": "text", "text": str(send_back)}]}
        if send_back in STRUCTURED:
            result["structuredContent"] = STRUCTURED[send_back]
        return result
    if name == "grow":
        GROWN[0] = True
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    if name == "cyc_output":
        return {"content": [{"type": "text", "text": "q"}], "structuredContent": {"q": 1}}
    if name == "video":
        return {"content": [{"type": "video", "data": "?"}]}  # no such content block
    if name == "list_requests":
        return {"content": [{"type": "text", "text": str(LIST_REQUESTS[0])}]}
    return {"content": [{"type": "text", "text": f"called {name}"}]}


LIST_REQUESTS = [0]


BROKEN_ANSWERS: dict[str, Any] = {  # tools/call answers that are not valid JSON-RPC
    "text_result": lambda i: {"jsonrpc": "2.0", "id": i, "result": "plain text"},
    "bad_error": lambda i: {"jsonrpc": "2.0", "id": i, "error": {"code": "boom"}},
    "no_version": lambda i: {"id": i, "result": {"content": []}},
}


def main() -> None:
    if MODE == "answers":
        print("raw server ready", flush=True)  # a banner where only JSON-RPC belongs
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # notifications, and answers to requests this server never sends
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"},
            }
        elif method == "tools/list":
            LIST_REQUESTS[0] += 1
            result = listing()
        elif method == "tools/call":
            name = (message.get("params") or {}).get("name")
            if MODE == "answers" and name in BROKEN_ANSWERS:
                send(BROKEN_ANSWERS[name](request_id))
                continue
            if MODE == "deaf" and name == "deaf":
                threading.Event().wait()  # reads nothing more, ever (killed on close)
            result = call(message.get("params") or {})
        elif method == "ping":
            result = {}
        else:  # server/discover included: this is a 2025 server
            error = {"code": -32601, "message": f"unknown method {method}"}
            send({"jsonrpc": "2.0", "id": request_id, "error": error})
            continue
        send({"jsonrpc": "2.0", "id": request_id, "result": result})


if __name__ == "__main__":
    main()
