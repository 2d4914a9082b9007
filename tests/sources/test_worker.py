"""WorkerSource, the base of the package kinds (javascript, isolated python): how a failed
setup step ends up in the source's status."""

from __future__ import annotations

import sys

from toolmesh import Toolkit, tool
from toolmesh.sources.worker import WorkerSource


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
