"""Cold and warm call latency of every built-in tool, and the shell tool against a bare
``subprocess.run`` of the same command (the peer: what any runtime pays to start a process).

Every call goes through the whole in-process pipeline (policy, validation, deadline, audit to an
in-memory store). Warm figures are medians of interleaved rounds; the shell comparison
interleaves the tool and the bare call one by one, so machine load hits both alike.

    .venv/bin/python bench/bench_builtins.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from toolmesh import Toolkit, create_toolkit

PATCH_FORWARD = "--- a/p.txt\n+++ b/p.txt\n@@ -1 +1 @@\n-one\n+two\n"
PATCH_BACK = "--- a/p.txt\n+++ b/p.txt\n@@ -1 +1 @@\n-two\n+one\n"


class Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = b"hello"
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def calls(url: str) -> dict[str, Callable[[int], tuple[str, dict[str, Any]]]]:
    """Per built-in: the call to make in round ``n`` (alternating where the call changes state)."""
    return {
        "read_file": lambda n: ("read_file", {"path": "data/file.txt"}),
        "write_file": lambda n: ("write_file", {"path": "out.txt", "content": f"{n}\n" * 50}),
        "edit_file": lambda n: (
            "edit_file",
            {"path": "e.txt", "old": "ab"[n % 2], "new": "ab"[(n + 1) % 2]},
        ),
        "list_files": lambda n: ("list_files", {"path": "data"}),
        "glob": lambda n: ("glob", {"pattern": "**/*.py"}),
        "grep": lambda n: ("grep", {"pattern": r"def \w+", "include": "*.py"}),
        "apply_patch": lambda n: ("apply_patch", {"patch": (PATCH_FORWARD, PATCH_BACK)[n % 2]}),
        "shell (allow-list)": lambda n: ("shell", {"command": "echo hi"}),
        "http_request": lambda n: ("http_request", {"url": url}),
        "python": lambda n: ("python", {"code": "print(1)"}),
    }


def workspace() -> Path:
    root = Path(tempfile.mkdtemp(prefix="bench-builtins-"))
    (root / "data").mkdir()
    (root / "data" / "file.txt").write_text("".join(f"line {i}\n" for i in range(200)))
    for i in range(50):
        (root / "data" / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n" * 20)
    (root / "e.txt").write_text("a\n")
    (root / "p.txt").write_text("one\n")
    return root


async def kit(root: Path, **overrides: Any) -> Toolkit:
    builtins = {
        "http_request": {"allow_private": True},
        "python": {"isolation": "none"},
        **overrides,
    }
    return await create_toolkit(builtins=builtins, workspace=root, audit=":memory:")


async def timed(toolkit: Toolkit, name: str, args: dict[str, Any]) -> float:
    started = time.perf_counter()
    result = await toolkit.execute(name, args)
    elapsed = time.perf_counter() - started
    if not result.success:
        raise RuntimeError(f"{name} failed: {result.error}")
    return elapsed * 1000


async def per_tool(root: Path, url: str, rounds: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    plans = calls(url)
    kits = {
        "plain": await kit(root),
        "shell *": await kit(root, shell={"allow": "*"}),
    }
    if shutil.which("bwrap"):
        kits["bwrap"] = await kit(
            root,
            shell={"allow": "*", "isolation": "bubblewrap", "view": "read-only"},
            python={"isolation": "bubblewrap", "view": "read-only"},
        )
        kits["overlay"] = await kit(root, shell={"allow": "*", "isolation": "bubblewrap"})
    rows: list[tuple[str, Toolkit, Callable[[int], tuple[str, dict[str, Any]]]]] = [
        (label, kits["plain"], plan) for label, plan in plans.items()
    ]
    rows.append(("shell (bash -c)", kits["shell *"], lambda n: ("shell", {"command": "echo hi"})))
    if "bwrap" in kits:
        rows.append(("shell (bwrap, read-only)", kits["bwrap"], plans["shell (allow-list)"]))
        rows.append(("shell (bwrap, overlay)", kits["overlay"], plans["shell (allow-list)"]))
        rows.append(("python (bwrap)", kits["bwrap"], plans["python"]))
    samples: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    for label, toolkit, plan in rows:  # cold: the first call of each
        name, args = plan(0)
        results[label] = {"cold_ms": await timed(toolkit, name, args)}
    heavy = {"python", "python (bwrap)", "shell (bwrap, read-only)", "shell (bwrap, overlay)"}
    for n in range(1, rounds + 1):  # warm: interleaved rounds
        for label, toolkit, plan in rows:
            if label in heavy and n > max(20, rounds // 5):
                continue
            name, args = plan(n)
            samples[label].append(await timed(toolkit, name, args))
    for label, values in samples.items():
        results[label]["warm_ms"] = statistics.median(values)
        results[label]["n"] = len(values)
    for toolkit in kits.values():
        await toolkit.close()
    return results


async def shell_versus_bare(root: Path, rounds: int) -> dict[str, dict[str, float]]:
    """The shell tool against subprocess.run of the same command, interleaved one by one."""
    out: dict[str, dict[str, float]] = {}
    pairs = [
        ("allow-list: echo hi", {"allow": ["echo"]}, ["/usr/bin/echo", "hi"]),
        ("bash -c 'echo hi'", {"allow": "*"}, ["/bin/bash", "-c", "echo hi"]),
    ]
    for label, shell, argv in pairs:
        toolkit = await kit(root, shell=shell)
        await timed(toolkit, "shell", {"command": "echo hi"})
        tool_ms: list[float] = []
        bare_ms: list[float] = []
        for _ in range(rounds):
            tool_ms.append(await timed(toolkit, "shell", {"command": "echo hi"}))
            started = time.perf_counter()
            subprocess.run(argv, capture_output=True, cwd=root, check=True)
            bare_ms.append((time.perf_counter() - started) * 1000)
        await toolkit.close()
        tool, bare = statistics.median(tool_ms), statistics.median(bare_ms)
        out[label] = {
            "tool_ms": tool,
            "bare_ms": bare,
            "overhead_ms": tool - bare,
            "ratio": tool / bare,
        }
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    options = parser.parse_args()
    root = workspace()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    load_before = os.getloadavg()
    try:
        tools = await per_tool(root, url, options.rounds)
        shell = await shell_versus_bare(root, options.rounds)
    finally:
        server.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()[0]
    print(f"load average {load_before[0]:.2f} -> {load_after:.2f}; python {sys.version.split()[0]}")
    print(f"{'built-in':28} {'cold ms':>9} {'warm ms':>9} {'n':>5}")
    for label, row in tools.items():
        print(f"{label:28} {row['cold_ms']:9.2f} {row['warm_ms']:9.2f} {int(row['n']):5d}")
    header = f"{'tool ms':>9} {'bare ms':>9} {'overhead':>9} {'ratio':>6}"
    print(f"\n{'shell vs subprocess.run':28} {header}")
    for label, row in shell.items():
        print(
            f"{label:28} {row['tool_ms']:9.2f} {row['bare_ms']:9.2f} "
            f"{row['overhead_ms']:9.2f} {row['ratio']:6.2f}"
        )
    print(json.dumps({"load": load_before, "tools": tools, "shell_vs_bare": shell}))


if __name__ == "__main__":
    asyncio.run(main())
