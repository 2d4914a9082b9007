"""WorkerSource, the base of the package kinds (javascript, isolated python): how a failed
setup step ends up in the source's status, and what a worker's stderr costs."""

from __future__ import annotations

import asyncio
import os
import sys

from toolmesh import Toolkit, tool
from toolmesh.sources.worker import STDERR_LINE_CHARS, STDERR_LINES, Worker, WorkerSource


class StallingSetup(WorkerSource):
    """A package whose setup step (an npm install, a pip install, an esbuild) never ends."""

    kind = "stalling"

    async def prepare(self) -> None:
        await self.run_setup(
            [sys.executable, "-c", "import signal; signal.pause()"],
            "installing its dependencies",
            timeout=0.5,
        )

    def command(self) -> tuple[list[str], str, dict[str, str]]:
        raise AssertionError("prepare() never succeeds")


def hello() -> str:
    """Answers while a broken package fails beside it."""
    return "fine"


async def test_a_setup_step_that_times_out_fails_only_its_source() -> None:
    # Its subprocess.TimeoutExpired raised out of Toolkit.start: the whole toolkit failed.
    source = StallingSetup("stalling")
    async with Toolkit(tool(hello), source) as kit:
        assert (await kit.execute("hello", {})).data == "fine"
        assert kit.names() == ["hello"]
    assert source.status.state == "failed"
    assert source.status.reason.startswith("stalling: Command ")
    assert "timed out after 0.5 seconds" in source.status.reason


CHATTY = """
import os, sys
for _ in range(3):  # each line far longer than a stderr line is kept, written in pieces
    for _ in range(16):
        os.write(2, b"x" * (256 * 1024))
    os.write(2, b"\\n")
os.write(2, "€".encode() * 5000 + b"\\n")  # 3 bytes each: the bytes kept end in one
os.write(2, b"last words\\n")
os.close(2)
print('{"type": "ready", "tools": []}', flush=True)
sys.stdin.read()
"""


async def test_the_kept_stderr_tail_is_bounded_in_characters() -> None:
    """Each kept line could hold up to the 32 MiB a message may have: 40 of them, 1.3 GB."""
    worker = Worker(
        [sys.executable, "-c", CHATTY], cwd=os.getcwd(), env=dict(os.environ), label="chatty"
    )
    try:
        await worker.start(30)
        await asyncio.wait_for(worker._tasks[1], 30)  # the stderr reader, at its end
        lines = list(worker.stderr)
    finally:
        await worker.close()
    assert len(lines) == 5 and lines[-1] == "last words"
    marker = f" [... cut: the line was {4 * 1024 * 1024} bytes long]"
    assert lines[:3] == ["x" * STDERR_LINE_CHARS + marker] * 3
    assert lines[3] == "€" * STDERR_LINE_CHARS + " [... cut: the line was 15000 bytes long]"
    assert sum(map(len, lines)) < STDERR_LINES * (STDERR_LINE_CHARS + 100)
