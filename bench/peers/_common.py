"""Shared helpers for the peer benchmarks (stats, versions, server subprocesses).

Not a benchmark itself. Every bench_*.py imports this from its own folder.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVERS = str(HERE / "_servers.py")

T_IMPORT = time.perf_counter()
# A variant is skipped (and the skip recorded) when the script has run this long already, so that
# every script stays under 60 s even on a loaded machine. PEERBENCH_SOFT_BUDGET_S overrides.
SOFT_BUDGET_S = float(os.environ.get("PEERBENCH_SOFT_BUDGET_S", "30"))


def elapsed() -> float:
    return time.perf_counter() - T_IMPORT


def over_budget() -> bool:
    return elapsed() > SOFT_BUDGET_S


# Every child process we start is tracked here by PID and killed by that PID on exit.
_CHILDREN: dict[int, subprocess.Popen] = {}


def versions(*extra: str) -> dict[str, str]:
    names = [
        "mcp",
        "fastmcp",
        "a2a-sdk",
        "uvicorn",
        "starlette",
        "httpx",
        "httpcore",
        "h11",
        "anyio",
        "pydantic",
        "pydantic-core",
        "sse-starlette",
        "protobuf",
        "httpx2",
        "httpcore2",
        "mcp-types",
        "fastmcp-slim",
        *extra,
    ]
    out = {"python": platform.python_version()}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            pass
    return out


def machine() -> dict:
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"cpus": os.cpu_count(), "loadavg_at_start": load, "platform": platform.platform()}


# ---------------------------------------------------------------- statistics


def pct(sorted_vals: list[float], p: float) -> float:
    """Nearest-rank percentile of an already-sorted list."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def run_stats(lat_ns: list[int], wall_s: float) -> dict:
    """One run: throughput over the wall clock and per-call latency percentiles (microseconds)."""
    s = sorted(lat_ns)
    n = len(s)
    return {
        "n": n,
        "wall_s": round(wall_s, 4),
        "calls_per_s": round(n / wall_s, 1) if wall_s > 0 else None,
        "p50_us": round(pct(s, 50) / 1e3, 1),
        "p99_us": round(pct(s, 99) / 1e3, 1),
        "mean_us": round(sum(s) / n / 1e3, 1),
        "max_us": round(s[-1] / 1e3, 1),
    }


def summarize(
    runs: list[dict],
    keys=("calls_per_s", "p50_us", "p99_us", "client_cpu_us_per_call", "server_cpu_us_per_call"),
) -> dict:
    """Across repeated runs: median, min and max of each metric, plus the raw runs."""
    out: dict = {"runs": len(runs)}
    for k in keys:
        vals = [r[k] for r in runs if r.get(k) is not None]
        if not vals:
            continue
        out[k] = {
            "median": round(statistics.median(vals), 1),
            "min": round(min(vals), 1),
            "max": round(max(vals), 1),
        }
    out["per_run"] = runs
    return out


def summarize_values(vals: list[float], nd: int = 3) -> dict:
    return {
        "median": round(statistics.median(vals), nd),
        "min": round(min(vals), nd),
        "max": round(max(vals), nd),
        "runs": [round(v, nd) for v in vals],
    }


def emit(result: dict) -> None:
    """Print the single JSON result line."""
    try:
        result.setdefault("machine", {})["loadavg_at_end"] = os.getloadavg()
    except OSError:
        pass
    sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- processes

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """utime+stime of a process (all its threads), in seconds; 1/CLK_TCK resolution."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except OSError:
        return None


class CpuMeter:
    """CPU seconds spent by this process and (optionally) a server process over a block."""

    def __init__(self, server_pid: int | None = None):
        self.server_pid = server_pid

    def __enter__(self):
        self.c0 = time.process_time()
        self.s0 = cpu_s(self.server_pid) if self.server_pid else None
        return self

    def __exit__(self, *exc):
        self.client_s = time.process_time() - self.c0
        self.server_s = (
            (cpu_s(self.server_pid) - self.s0) if self.server_pid and self.s0 is not None else None
        )

    def annotate(self, stats: dict) -> dict:
        n = stats["n"]
        stats["client_cpu_us_per_call"] = round(self.client_s / n * 1e6, 1)
        if self.server_s is not None:
            stats["server_cpu_us_per_call"] = round(self.server_s / n * 1e6, 1)
        return stats


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _kill(pid: int) -> None:
    p = _CHILDREN.pop(pid, None)
    if p is None or p.poll() is not None:
        return
    try:
        p.terminate()  # SIGTERM to exactly this PID
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=5)
    except ProcessLookupError:
        pass


def _kill_all() -> None:
    for pid in list(_CHILDREN):
        _kill(pid)


atexit.register(_kill_all)


def _on_signal(signum, frame):  # noqa: ARG001
    _kill_all()
    sys.exit(128 + signum)


for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_sig, _on_signal)


class Server:
    """A server subprocess from _servers.py that prints one JSON line ({"port": ...}) when ready.

    Its stdin is a pipe we hold: the server exits on EOF, so it cannot outlive us.
    Stopped by its own PID (SIGTERM, then SIGKILL) on exit of the `with` block.
    """

    def __init__(self, *args: str, ready_timeout: float = 30.0):
        self.args = args
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}

    def __enter__(self) -> "Server":
        self.proc = subprocess.Popen(
            [sys.executable, SERVERS, *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        _CHILDREN[self.proc.pid] = self.proc
        deadline = time.monotonic() + self.ready_timeout
        line = b""
        fd = self.proc.stdout.fileno()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.__exit__(None, None, None)
                raise RuntimeError(
                    f"server {self.args} did not become ready (rc={self.proc.returncode})"
                )
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 4096)
                if not chunk:
                    continue
                line += chunk
        self.info = json.loads(line.decode().strip().splitlines()[-1])
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.info["port"])

    def rss_kib(self) -> int | None:
        return rss_kib(self.pid)

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
            except OSError:
                pass
            _kill(self.proc.pid)


def assert_no_children_left() -> list[int]:
    """PIDs of our direct children that are still alive (should be empty). Kills them by PID."""
    left = []
    try:
        kids = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    except OSError:
        kids = []
    for k in kids:
        pid = int(k)
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":  # already exited, just not reaped yet
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            left.append(pid)
        except ProcessLookupError:
            pass
    return left


# ---------------------------------------------------------------- timing loops


async def time_sequential(call, n: int, server_pid: int | None = None) -> dict:
    """Await `call()` n times back to back; per-call latency and calls/s over the whole loop.

    Also CPU time per call of this process (client) and, if given, of the server process."""
    lat: list[int] = []
    pc = time.perf_counter_ns
    with CpuMeter(server_pid) as cpu:
        t0 = pc()
        for _ in range(n):
            s = pc()
            await call()
            lat.append(pc() - s)
        wall = (pc() - t0) / 1e9
    return cpu.annotate(run_stats(lat, wall))


async def time_concurrent(
    call, total: int, concurrency: int, server_pid: int | None = None
) -> dict:
    """`concurrency` asyncio workers share `total` calls; latency per call, calls/s over the wall clock."""
    import asyncio

    lat: list[int] = []
    pc = time.perf_counter_ns
    remaining = total

    async def worker():
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            s = pc()
            await call()
            lat.append(pc() - s)

    with CpuMeter(server_pid) as cpu:
        t0 = pc()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = (pc() - t0) / 1e9
    out = cpu.annotate(run_stats(lat, wall))
    out["concurrency"] = concurrency
    return out
