"""Start a coroutine as an eager task: its first step runs at once, inside its own task.

Most tool calls finish without waiting on anything. A normal task would cost a scheduling round
and a wake-up for each; an eager task that finishes on its first step is simply done. Python
3.12 has this built in (``eager_start=True``). On 3.11 the task is asyncio's own (C) Task: its
constructor hands its first step to ``loop.call_soon``, which is intercepted for that moment so
the step runs here instead, with ``asyncio.current_task()`` naming the new task during it, as
timeouts, task groups and cancel scopes require.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Callable, Coroutine
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


class _FirstStep:
    """Takes the place of ``loop.call_soon`` while a task is built, keeping its first step."""

    __slots__ = ("args", "callback", "context")

    def __init__(self) -> None:
        self.callback: Callable[..., object] | None = None
        self.args: tuple[Any, ...] = ()
        self.context: contextvars.Context | None = None

    def __call__(self, callback: Callable[..., object], *args: Any, context: Any = None) -> None:
        self.callback, self.args, self.context = callback, args, context


_FIRST_STEP = "_toolmesh_first_step"


def _eager_task_311(
    coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop, context: contextvars.Context
) -> asyncio.Future[T]:
    tasks: Any = asyncio.tasks
    namespace: dict[str, Any] | None = getattr(loop, "__dict__", None)
    if namespace is None or "call_soon" in namespace:
        # A loop whose call_soon cannot be intercepted (or already is, by someone else):
        # asyncio's pure-Python Task, built without scheduling, does the same more slowly.
        return _eager_py_task(coro, loop, context)
    first: _FirstStep | None = namespace.get(_FIRST_STEP)
    if first is None:
        first = namespace[_FIRST_STEP] = _FirstStep()  # one per loop: a loop runs one thread
    namespace["call_soon"] = first  # an instance attribute shadows the method for a moment
    try:
        task: asyncio.Future[T] = asyncio.Task(coro, loop=loop, context=context)
    finally:
        del namespace["call_soon"]
    step, args, step_context = first.callback, first.args, first.context
    first.callback = first.context = None
    if step is None:  # pragma: no cover - a Task that did not schedule its first step
        return task
    caller = tasks.current_task(loop)
    if caller is not None:
        tasks._leave_task(loop, caller)
    try:
        (step_context or context).run(step, *args)
    finally:
        if caller is not None:
            tasks._enter_task(loop, caller)
    return task


class _Deferring:
    """Stands in for the loop while a pure-Python task is built, so its first step is not
    scheduled."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def get_debug(self) -> bool:
        return self._loop.get_debug()

    def call_soon(self, *args: Any, **kwargs: Any) -> None:
        return None


def _eager_py_task(
    coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop, context: contextvars.Context
) -> asyncio.Future[T]:
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
