"""Start a coroutine as an eager task: its first step runs at once, inside its own task.

Most tool calls finish without waiting on anything. A normal task would cost a scheduling round
and a wake-up for each; an eager task that finishes on its first step is simply done. Python
3.12 has this built in (``eager_start=True``); on 3.11 it is rebuilt here from asyncio's own
pure-Python Task, taking care that ``asyncio.current_task()`` names the new task during that
first step, as timeouts, task groups and cancel scopes require.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["start_eagerly"]

T = TypeVar("T")


def start_eagerly(
    coro: Coroutine[Any, Any, T], context: contextvars.Context | None = None
) -> asyncio.Future[T]:
    """A task for ``coro`` whose first step has already run, in the task (so
    ``asyncio.current_task()``, timeouts, task groups and cancel scopes inside it see the right
    task). When the coroutine finished on that step, the task is already done and was never
    scheduled."""
    loop = asyncio.get_running_loop()
    context = context or contextvars.copy_context()
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, context=context, eager_start=True)
    return _eager_task_311(coro, loop, context)


class _Deferring:
    """Stands in for the loop while a task is built, so its first step is not scheduled."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def get_debug(self) -> bool:
        return self._loop.get_debug()

    def call_soon(self, *args: Any, **kwargs: Any) -> None:
        return None


def _eager_task_311(
    coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop, context: contextvars.Context
) -> asyncio.Future[T]:
    # Python 3.11 has no eager tasks: build asyncio's reference (pure Python) Task without
    # scheduling it, make it the current task, and take its first step here, as 3.12 does.
    tasks: Any = asyncio.tasks
    task: Any = tasks._PyTask(coro, loop=_Deferring(loop), context=context)
    task._loop = loop
    caller = tasks.current_task(loop)
    if caller is not None:
        tasks._leave_task(loop, caller)
    try:
        context.run(task._Task__step)  # a scheduled step runs in the task's context too
    finally:
        if caller is not None:
            tasks._enter_task(loop, caller)
    future: asyncio.Future[T] = task
    return future
