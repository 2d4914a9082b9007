"""toolmesh's runner for tools written as isolated Python packages (see sources/worker.py).

Usage: python -I python_runner.py IMPORT_ROOT MODULE:ATTR

Runs in the package's own virtual environment and imports nothing of toolmesh. It speaks one
JSON object per line: calls on stdin, answers on the original stdout; whatever the tool code
prints goes to stderr, so it cannot break the protocol.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO


def main() -> None:
    root, entry = sys.argv[1], sys.argv[2]
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # the tool's own prints (Python and C level) go to stderr
    lock = threading.Lock()

    def send(message: dict[str, Any]) -> None:
        # NaN and infinity are not JSON: refused here (the call answers "not JSON"), as the
        # JavaScript runner cannot send them either, rather than passed on as a float no peer
        # can read.
        line = json.dumps(message, default=str, allow_nan=False)
        with lock:
            protocol.write(line + "\n")
            protocol.flush()

    try:
        tools = load(root, entry)
    except Exception as exc:
        send({"type": "fatal", "message": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    send({"type": "ready", "tools": [describe(t) for t in tools.values()]})
    asyncio.run(serve(tools, send, sys.stdin))


def load(root: str, entry: str) -> dict[str, Any]:
    sys.path.insert(0, root)
    module_name, _, attr = entry.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in (attr or "tools").split("."):
        found = getattr(found, part)
    items = found if isinstance(found, list | tuple) else [found]
    tools: dict[str, Any] = {}
    for item in items:
        if not callable(field(item, "execute")) or not isinstance(field(item, "name"), str):
            raise TypeError(
                f"{entry} must be a tool (name, description, parameters, execute) or a list of them"
            )
        if field(item, "name") in tools:  # one would silently shadow the other
            raise ValueError(f"two tools are named {field(item, 'name')!r}; names must be unique")
        tools[field(item, "name")] = item
    return tools


def field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def describe(item: Any) -> dict[str, Any]:
    return {
        "name": field(item, "name"),
        "description": field(item, "description") or "",
        "parameters": field(item, "parameters") or {"type": "object", "properties": {}},
        "capabilities": list(field(item, "capabilities") or []),
    }


async def serve(
    tools: dict[str, Any], send: Callable[[dict[str, Any]], None], stdin: TextIO
) -> None:
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task[None]] = set()
    while line := await loop.run_in_executor(None, stdin.readline):
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("type") == "call":
            task = asyncio.ensure_future(call(tools, message, send))
            running.add(task)
            task.add_done_callback(running.discard)


async def call(
    tools: dict[str, Any], message: dict[str, Any], send: Callable[[dict[str, Any]], None]
) -> None:
    call_id = message.get("id")
    tool = tools.get(str(message.get("tool")))
    if tool is None:
        send({"type": "error", "id": call_id, "message": f"no tool {message.get('tool')!r}"})
        return

    def emit(kind: str, data: dict[str, Any] | None = None) -> None:
        send({"type": "event", "id": call_id, "kind": kind, "data": data or {}})

    def activity(activity_type: str, patch: list[dict[str, Any]]) -> None:
        emit("activity", {"activity_type": activity_type, "patch": patch})

    payload = {
        "args": message.get("args") or {},
        "state": message.get("state") or {},
        "emit": emit,
        "activity": activity,
    }
    execute = field(tool, "execute")
    try:
        if inspect.iscoroutinefunction(execute):
            answer = await execute(payload)
        else:
            answer = await asyncio.to_thread(execute, payload)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # sys.exit() in a tool must answer, not hang the call
        send({"type": "error", "id": call_id, "message": f"{type(exc).__name__}: {exc}"})
        return
    if not (isinstance(answer, dict) and "output" in answer):
        answer = {"output": answer}
    result = {
        "type": "result",
        "id": call_id,
        "output": answer.get("output"),
        "state_update": answer.get("state_update"),
    }
    try:
        send(result)
    except Exception as exc:  # a circular or unprintable output: answer, or the call hangs
        send({"type": "error", "id": call_id, "message": f"the output is not JSON: {exc!r}"})


if __name__ == "__main__":
    main()
