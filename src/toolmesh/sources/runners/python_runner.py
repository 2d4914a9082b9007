"""toolmesh's runner for tools written as isolated Python packages (see sources/worker.py).

Usage: python -I python_runner.py IMPORT_ROOT MODULE:ATTR

Runs in the package's own virtual environment and imports nothing of toolmesh. It speaks one
JSON object per line: calls on stdin, answers on the original stdout; whatever the tool code
prints goes to stderr, so it cannot break the protocol.

On Linux the process toolmesh starts is a small init above the worker: a subreaper
(``PR_SET_CHILD_SUBREAPER``) that forks the worker and then only reaps. A process a tool starts
and that loses its parent (a daemon that double-forked, left the session and dropped its
environment) is handed to the init instead of the system's, so toolmesh still finds it as a
descendant when it kills the worker; when the worker ends by itself, the init kills what is left
and ends as the worker did (its exit code, or its signal). The worker's own children stay its
own, so the init never takes their exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn, TextIO

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def main() -> None:
    adopt_orphans()
    root, entry = sys.argv[1], sys.argv[2]
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # the tool's own prints (Python and C level) go to stderr
    # Calls are read from a descriptor of the runner's own; the tool's stdin (fd 0, sys.stdin)
    # is empty. A child forked while the reading thread waits in readline (multiprocessing's
    # "fork" start closes sys.stdin first) would otherwise block for ever on that thread's lock,
    # and a subprocess reading its stdin would take the calls.
    calls = os.fdopen(os.dup(0), "r", encoding="utf-8")
    empty = os.open(os.devnull, os.O_RDONLY)
    os.dup2(empty, 0)
    os.close(empty)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - for the process's life
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
    asyncio.run(serve(tools, send, calls))


def adopt_orphans() -> None:
    """Become the init of the worker (see the module's doc): returns in the worker, forked
    below it; where no subreaper can be had (not Linux), returns at once, as the worker."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return
    if prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return
    init = os.getpid()
    worker = os.fork()
    if worker == 0:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the init gone: so is the worker
        if os.getppid() != init:  # it went before the line above
            os._exit(1)
        return
    serve_as_init(worker)


def serve_as_init(worker: int) -> NoReturn:
    """Reap what is handed over until ``worker`` ends; then end what is left, and end as it
    did."""
    quiet = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the pipes are the worker's: they close when it ends
        os.dup2(quiet, fd)
    while True:
        pid, status = os.wait()
        if pid == worker:
            break
    end_orphans()
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set (nor needs to)
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal whose default is not to end
    os._exit(os.waitstatus_to_exitcode(status))


def end_orphans() -> None:
    """Kill the processes handed to this init and those handed over as they die, until it has
    no child left."""
    me = os.getpid()
    while True:
        for pid in children_of(me):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.wait()  # one ended: its own children are handed over before it is reaped
        except ChildProcessError:
            return


def children_of(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (read from /proc as toolmesh's process_tree
    does: this runner imports nothing of toolmesh, so it cannot share that code)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # state ppid ...
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry))
    return found


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
