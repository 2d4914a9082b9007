"""Eager tasks: the first step runs at once, inside its own task, whatever the Python version."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import anyio
import pytest

from toolmesh.eager import start_eagerly

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="caller")


async def test_finishing_on_the_first_step_is_done_at_once() -> None:
    steps: list[str] = []

    async def quick() -> int:
        steps.append("ran")
        return 7

    task = start_eagerly(quick())
    assert steps == ["ran"] and task.done() and task.result() == 7


async def test_current_task_is_the_eager_task_during_the_first_step() -> None:
    caller = asyncio.current_task()
    seen: list[object] = []

    async def look() -> None:
        seen.append(asyncio.current_task())
        await asyncio.sleep(0)
        seen.append(asyncio.current_task())

    task = start_eagerly(look())
    assert asyncio.current_task() is caller  # restored after the step
    await task
    assert seen == [task, task] and seen[0] is not caller


async def test_asyncio_timeout_inside_cancels_the_tool_not_the_caller() -> None:
    async def bounded() -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        except TimeoutError:
            return "timed out inside"
        return "unreachable"

    task = start_eagerly(bounded())
    assert await task == "timed out inside"
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_task_group_and_anyio_cancel_scopes_work_inside() -> None:
    async def grouped() -> list[int]:
        async with asyncio.TaskGroup() as group:
            first = group.create_task(asyncio.sleep(0, result=1))
            second = group.create_task(asyncio.sleep(0, result=2))
        return [first.result(), second.result()]

    async def scoped() -> str:
        with anyio.move_on_after(0.01) as scope:
            await anyio.sleep(10)
        return "moved on" if scope.cancelled_caught else "slept"

    assert await start_eagerly(grouped()) == [1, 2]
    assert await start_eagerly(scoped()) == "moved on"


async def test_exceptions_stay_in_the_task() -> None:
    async def broken() -> None:
        raise ValueError("first step")

    task = start_eagerly(broken())
    assert task.done()
    with pytest.raises(ValueError, match="first step"):
        task.result()


async def test_cancelling_a_suspended_eager_task() -> None:
    cleaned = asyncio.Event()

    async def waits() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    task = start_eagerly(waits())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()


async def test_context_changes_stay_inside() -> None:
    async def change() -> str:
        VAR.set("tool")
        await asyncio.sleep(0)
        return VAR.get()

    assert await start_eagerly(change()) == "tool"
    assert VAR.get() == "caller"


async def test_a_loop_whose_call_soon_is_already_replaced_still_gets_eager_tasks() -> None:
    """Someone else's instrumentation of loop.call_soon is left alone (the slower pure-Python
    task is used instead)."""
    loop = asyncio.get_running_loop()
    scheduled: list[object] = []
    original = loop.call_soon

    def counting(callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        scheduled.append(callback)
        return original(callback, *args, context=context)

    loop.call_soon = counting  # type: ignore[method-assign]
    try:
        seen: list[object] = []

        async def look() -> int:
            seen.append(asyncio.current_task())
            return 5

        task = start_eagerly(look())
        assert task.done() and task.result() == 5 and seen == [task]
        assert loop.call_soon is counting and scheduled == []
    finally:
        del loop.call_soon
