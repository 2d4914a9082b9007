"""A small toolkit to serve and call: `toolmesh serve --tools examples.quickstart:TOOLS`."""

from __future__ import annotations

import asyncio
import datetime
from typing import Literal

from toolmesh import ToolContext, tool


@tool
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@tool
def now(zone: Literal["utc", "local"] = "utc") -> str:
    """The current date and time as ISO 8601.

    Args:
        zone: UTC or the host's local time.
    """
    moment = datetime.datetime.now(datetime.UTC if zone == "utc" else None)
    return moment.isoformat(timespec="seconds")


@tool
async def countdown(ctx: ToolContext, seconds: int = 3) -> str:
    """Count down, streaming a progress event every second.

    Args:
        seconds: How long to count.
    """
    for left in range(seconds, 0, -1):
        ctx.progress((seconds - left) * 100 // seconds, f"{left} s left")
        await asyncio.sleep(1)
    ctx.progress(100, "done")
    return "liftoff"


TOOLS = [add, now, countdown]
