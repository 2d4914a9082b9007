"""The path of one call, the same for every source and every transport::

    resolve tool            unknown_tool
    -> policy               tool_denied (capabilities held by the session, then policy hooks)
    -> validate arguments   invalid_arguments, with the JSON path of the bad field
    -> execute under deadline   timeout / cancelled; events stream with seq 0, 1, 2, ...
    -> shape result         bounded whole (truncated flag), duration_ms, state patch applied
    -> audit entry          written before the result is returned

A tool that ignores cancellation cannot hold the caller past its deadline: the pipeline stops
waiting at the deadline, cancels the tool, and answers with a timeout result at once. A tool
whose source promises it ends promptly when cancelled (``Tool.cancels_promptly``) runs in the
caller's own task instead, which saves a task and a wake-up per call.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_json, to_jsonable_python

from toolmesh import strictjson
from toolmesh.audit import AuditEntry, digest_arguments, log_lost_entry
from toolmesh.eager import start_eagerly
from toolmesh.errors import ArgumentError, SchemaError, StateError
from toolmesh.models import ToolErrorCode, ToolEvent, ToolResult, secret_id
from toolmesh.strictjson import mend_text
from toolmesh.tools import (
    MAX_EVENTS_BYTES,
    Output,
    Tool,
    ToolContext,
    event_cost,
    event_data_size,
)

if TYPE_CHECKING:
    from toolmesh.session import Session
    from toolmesh.state import StateManager
    from toolmesh.store.base import Store

__all__ = ["CallSpec", "Decision", "Limits", "Pipeline", "PolicyHook", "ToolResolver"]

logger = logging.getLogger("toolmesh.pipeline")

EventSink = Callable[[ToolEvent], None]


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy hook's verdict on one call; ``rule`` names what decided (it is audited).
    ``needs_approval``: allowed only once an approver says yes."""

    allowed: bool
    reason: str = ""
    rule: str = ""
    needs_approval: bool = False


def _unchanged() -> None:
    return None


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What an approver is asked: may this call run?

    ``shown()`` is for an approver that queues requests (one shown at a time): called when this
    one is shown, it starts the approval timeout again from then, so time spent waiting behind
    other requests is not taken from the time to answer it."""

    id: str
    tool_name: str
    arguments: Mapping[str, Any]
    reason: str
    session_id: str
    req_id: str
    event: ToolEvent  # the call's `approval` event (seq 0), for the transport to deliver
    shown: Callable[[], None] = _unchanged


Approver = Callable[[ApprovalRequest], Awaitable[bool] | bool]
"""Answers an approval request: True runs the call, False denies it (returned or awaited)."""


async def ask(approver: Approver, request: ApprovalRequest) -> object:
    """``approver``'s answer to ``request``, returned or awaited (it may break its type: the
    caller checks it)."""
    answer = approver(request)
    return await answer if inspect.isawaitable(answer) else answer


class ApprovalPending(Exception):
    """Raised by an approver whose answer comes with a later request (MCP's 2026-07-28
    multi-round-trip calls): the call ends unanswered and unaudited, as nothing was decided."""


class ApprovalFailed(Exception):
    """Raised by an approver to deny because approving failed, not because someone said no
    (a wire client whose handler raised answers so): audited as ``approval:failed``."""


class CallObserver:
    """Sees every call of a pipeline: its start, its events and its result (for AG-UI)."""

    def call_started(self, session: Session, spec: CallSpec, tool: Tool | None) -> None:
        """Before policy and validation."""

    def call_event(self, session: Session, spec: CallSpec, event: ToolEvent) -> None:
        """Each event, streaming or not."""

    def call_ended(self, session: Session, spec: CallSpec, result: ToolResult) -> None:
        """With the final result (state already applied)."""


PolicyHook = Callable[
    ["Session", Tool, Mapping[str, Any]], "Decision | Awaitable[Decision | None] | None"
]
"""Called in order after the capability check; the first verdict that is not None decides."""


_NAME_SHOWN = 200  # characters of an unknown name an error quotes (public names are 64 at most)


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds every call lives within.

    A result is bounded whole, so its answer always fits in one wire message (16 MiB by
    default): its output and its error text (``max_output_chars`` each, then cut with a note),
    its data (dropped with a note when its JSON is longer), its metadata (replaced by a note
    past ``max_metadata_bytes`` of JSON) and the events it keeps (``max_events_bytes``; the
    state event, bounded by the state's own limits, always). What was cut sets ``truncated``."""

    default_timeout: float = 30.0
    max_timeout: float = 3600.0
    max_output_chars: int = 200_000
    approval_timeout: float = 300.0
    max_metadata_bytes: int = 64 * 1024
    max_events_bytes: int = MAX_EVENTS_BYTES


@dataclass(slots=True)
class CallSpec:
    """One call as any protocol asks for it."""

    tool_name: str
    arguments: dict[str, Any]
    req_id: str = ""
    correlation_id: str = ""
    streaming: bool = False
    timeout: float | None = None
    prior_events: list[ToolEvent] = field(default_factory=list)  # before the tool ran: approval
    # The context of its tool while the pipeline waits for it (what ``Pipeline.abort`` ends)
    waiting: ToolContext | None = field(default=None, repr=False, compare=False)


class ToolResolver:
    """What the pipeline needs from a toolkit: look a tool up by name, list names for hints."""

    def get(self, name: str) -> Tool | None:  # pragma: no cover - interface
        raise NotImplementedError

    def names(self) -> Sequence[str]:  # pragma: no cover - interface
        raise NotImplementedError


class Pipeline:
    """Runs calls against one toolkit, with one store, one set of limits and hooks."""

    def __init__(
        self,
        tools: ToolResolver,
        *,
        store: Store,
        state: StateManager | None = None,
        limits: Limits | None = None,
        hooks: Sequence[PolicyHook] = (),
        host_id: str = "",
    ) -> None:
        self.tools = tools
        self.store = store
        self.state = state
        self.limits = limits or Limits()
        self.hooks = list(hooks)
        self.host_id = host_id
        self.audit_failures = 0
        self.observers: list[CallObserver] = []
        self._stragglers: set[asyncio.Future[Any]] = set()

    async def call(
        self, session: Session, spec: CallSpec, on_event: EventSink | None = None
    ) -> ToolResult:
        """Run one call through every step; always returns a result (or re-raises a
        cancellation of the caller itself, after auditing it)."""
        started = time.perf_counter()
        tool = self.tools.get(spec.tool_name)
        decision = ""
        try:
            measured = digest_arguments(spec.arguments)  # for the audit entry
            unfit, unfit_at = "", "$"
        except ValueError as exc:
            measured, unfit, unfit_at = (0, ""), str(exc), getattr(exc, "path", "$")
        observers = self.observers
        if observers:
            for observer in observers:
                observer.call_started(session, spec, tool)
            on_event = _observed(observers, session, spec, on_event)
        try:
            if tool is None:
                result = self._unknown(spec.tool_name)
            else:
                verdict = self._capability_verdict(session, tool)
                if verdict is None:
                    verdict = (
                        await self._ask_hooks(session, tool, spec.arguments)
                        if self.hooks
                        else _ALLOWED
                    )
                if (  # unfit arguments are refused below, before anyone is asked to approve them
                    verdict.allowed
                    and not unfit
                    and (verdict.needs_approval or tool.definition.requires_approval)
                ):
                    # What the audit says if the call is cancelled while it waits for the answer
                    decision = f"{verdict.rule}:approval:cancelled".lstrip(":")
                    verdict = await self._approve(session, tool, spec, verdict)
                decision = verdict.rule
                if not verdict.allowed:
                    result = _failure(tool.name, ToolErrorCode.TOOL_DENIED, verdict.reason)
                    result.metadata = {"rule": verdict.rule}
                    if verdict.rule.endswith("approval:timeout"):
                        result.error_code = ToolErrorCode.TIMEOUT
                elif unfit:
                    result = _failure(tool.name, ToolErrorCode.INVALID_ARGUMENTS, unfit)
                    result.metadata = {"path": unfit_at}
                else:
                    result = await self._validated_run(session, tool, spec, on_event)
            if spec.prior_events:
                self._keep_prior_events(spec, result)
        except asyncio.CancelledError:
            result = _failure(spec.tool_name, ToolErrorCode.CANCELLED, "the call was cancelled")
            self._keep_prior_events(spec, result)
            result.duration_ms = _elapsed_ms(started)
            try:
                await self._audit(session, spec, tool, result, decision, measured)
            finally:  # an AG-UI run, say, ends (as an error) here too
                for observer in observers:
                    observer.call_ended(session, spec, result)
            raise
        result.duration_ms = _elapsed_ms(started)
        try:
            await self._audit(session, spec, tool, result, decision, measured)
        finally:  # cancelled while audited, the call still ended (its state change made)
            for observer in observers:
                observer.call_ended(session, spec, result)
        return result

    async def record(
        self, session: Session, spec: CallSpec, result: ToolResult, *, source: str
    ) -> None:
        """Audit a call a transport answered itself (an MCP server's ``search_tools``), so
        every call is in the log whatever answered it."""
        try:
            measured = digest_arguments(spec.arguments)
        except ValueError:
            measured = (0, "")
        await self._audit(session, spec, None, result, "", measured, source=source)

    def abort(self, spec: CallSpec, reason: str) -> None:
        """End a call whose tool is running now, as its deadline would, as ``cancelled`` with
        ``reason`` (the tool is cancelled; the call is audited and answered as usual). For
        calls run in a task the caller must not lose, such as an in-process caller's own."""
        ctx = spec.waiting
        if ctx is None:
            return
        if ctx._end is not None:
            ctx._end(reason)
            return
        outcome = ctx._outcome
        if outcome is not None and not outcome.done():
            outcome.set_exception(_Aborted(reason))

    async def drain(self) -> None:
        """Give tools that outlived their deadline a last chance to finish (at shutdown)."""
        if self._stragglers:
            await asyncio.wait(self._stragglers, timeout=1.0)

    # -- steps -----------------------------------------------------------------------------------

    def _unknown(self, name: str) -> ToolResult:
        if len(name) > _NAME_SHOWN:  # no tool has such a name: quoted in part, not matched
            shown = f"{name[:_NAME_SHOWN]!r}... ({len(name)} characters)"
            return _failure(name, ToolErrorCode.UNKNOWN_TOOL, f"unknown tool {shown}")
        message = f"unknown tool {name!r}"
        names = self.tools.names()
        if len(names) <= 5000:
            import difflib  # for a mistyped name only

            close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
            if close:
                message += f"; did you mean {', '.join(repr(n) for n in close)}?"
        return _failure(name, ToolErrorCode.UNKNOWN_TOOL, message)

    def _capability_verdict(self, session: Session, tool: Tool) -> Decision | None:
        """A denial when the session lacks a capability the tool requires, else None."""
        required = tool.definition.capabilities
        missing = session.capabilities.missing(required) if required else None
        if missing is None:
            return None
        return Decision(
            False,
            f"tool {tool.name!r} requires capability {missing!r}, which this session does not hold",
            rule=f"capability:{missing}",
        )

    async def _ask_hooks(
        self, session: Session, tool: Tool, arguments: Mapping[str, Any]
    ) -> Decision:
        for index, hook in enumerate(self.hooks):
            try:
                verdict = hook(session, tool, arguments)
                if inspect.isawaitable(verdict):
                    verdict = await verdict
            except Exception as exc:  # a hook that cannot judge lets nothing by
                name = getattr(hook, "__name__", type(hook).__name__)
                reason = f"policy hook {name!r} failed: {_describe(exc)}"
                return Decision(False, reason, rule=f"hook:{index}:error")
            if verdict is not None:
                return verdict
        return _ALLOWED

    async def _approve(
        self, session: Session, tool: Tool, spec: CallSpec, verdict: Decision
    ) -> Decision:
        """Ask the session's approver; the answer (or its absence) becomes the verdict."""
        rule = f"{verdict.rule}:" if verdict.rule else ""
        approver = session.approver
        if approver is None:
            return Decision(
                False,
                f"tool {tool.name!r} requires approval and no approver is connected",
                rule=f"{rule}approval:unavailable",
            )
        approval_id = secret_id()
        reason = verdict.reason or f"{tool.name!r} requires approval"
        # What is approved is what runs: the call runs a copy taken now, and the approver (and
        # the event) see copies of their own, so a nested value changed while the approval
        # waits, by the caller or the approver, changes nothing that runs.
        spec.arguments = copy.deepcopy(spec.arguments)
        event = ToolEvent(
            kind="approval",
            req_id=spec.req_id,
            data={
                "approval_id": approval_id,
                "tool_name": tool.name,
                "arguments": copy.deepcopy(spec.arguments),
                "reason": reason,
            },
        )
        spec.prior_events.append(event)
        wait = self.limits.approval_timeout
        clock = asyncio.timeout(wait)
        loop = asyncio.get_running_loop()

        def shown() -> None:
            with contextlib.suppress(RuntimeError):  # answered, or expired, already
                clock.reschedule(loop.time() + wait)

        request = ApprovalRequest(
            id=approval_id,
            tool_name=tool.name,
            arguments=copy.deepcopy(spec.arguments),
            reason=reason,
            session_id=session.id,
            req_id=spec.req_id,
            event=event,
            shown=shown,
        )
        try:
            async with clock:
                approved = await ask(approver, request)
        except TimeoutError:
            return Decision(
                False,
                f"nobody approved {tool.name!r} within {wait:g}s",
                rule=f"{rule}approval:timeout",
            )
        except ApprovalPending:
            raise
        except ApprovalFailed as exc:
            return Decision(False, f"approval failed: {exc}", rule=f"{rule}approval:failed")
        except Exception as exc:
            return Decision(
                False, f"approval failed: {_describe(exc)}", rule=f"{rule}approval:failed"
            )
        if approved is False:
            return Decision(
                False, f"the approver denied {tool.name!r}", rule=f"{rule}approval:denied"
            )
        if approved is not True:  # only True approves: "no", None or 1 is no answer
            try:
                answer = repr(approved)
            except Exception:
                answer = object.__repr__(approved)
            answer = answer if len(answer) <= 80 else answer[:77] + "..."
            return Decision(
                False,
                f"approval failed: the approver answered {answer} "
                f"({type(approved).__name__}), not True or False",
                rule=f"{rule}approval:failed",
            )
        return Decision(True, verdict.reason, rule=f"{rule}approval:approved")

    async def _validated_run(
        self, session: Session, tool: Tool, spec: CallSpec, on_event: EventSink | None
    ) -> ToolResult:
        try:
            tool.validate(spec.arguments)
        except ArgumentError as exc:
            result = _failure(tool.name, ToolErrorCode.INVALID_ARGUMENTS, str(exc))
            result.metadata = {"path": exc.path}
            return result
        except SchemaError as exc:
            return _failure(tool.name, ToolErrorCode.TOOL_ERROR, f"tool schema is broken: {exc}")
        timeout = spec.timeout if spec.timeout and spec.timeout > 0 else None
        timeout = min(timeout or self.limits.default_timeout, self.limits.max_timeout)
        state = None
        if self.state is not None:
            state = None if self.state.read_through else self.state.cached(session.id)
            if state is None:
                try:
                    state = await self.state.ensure_loaded(session.id)
                except StateError as exc:  # a damaged record: the call fails, and is audited
                    return _failure(tool.name, ToolErrorCode.TOOL_ERROR, str(exc))
                except Exception as exc:  # the store failed (a lost connection, a locked file)
                    # As when an update cannot be saved: the call fails retryably, audited.
                    return _failure(
                        tool.name,
                        ToolErrorCode.TOOL_ERROR,
                        "the session state could not be read, so the tool did not run: "
                        f"{_describe(exc)}",
                    )
        now = time.monotonic()
        ctx = ToolContext(
            tool_name=tool.name,
            req_id=spec.req_id,
            session_id=session.id,
            agent_id=session.agent_id,
            correlation_id=spec.correlation_id,
            deadline=now + timeout,
            capabilities=session.capabilities,
            state=(lambda: state) if state is not None else None,
            sink=on_event if spec.streaming else None,
            events=spec.prior_events,
            event_budget=self.limits.max_events_bytes,
        )
        ctx._deadline_cap = now + self.limits.max_timeout
        if tool.cancels_promptly:
            spec.waiting = ctx
            try:
                result = await _run_in_caller(tool, spec.arguments, ctx, timeout)
            finally:
                spec.waiting = None
        else:
            # Start the tool eagerly: most finish without suspending, and then need neither a
            # task nor a timer. One that suspends continues as a task under the deadline.
            task = start_eagerly(_run_reporting(tool, spec.arguments, ctx))
            if task.done():
                result = _finished(tool, task, ctx)
            else:
                spec.waiting = ctx
                try:
                    result = await self._await_under_deadline(tool, task, ctx, timeout)
                finally:
                    spec.waiting = None
        if ctx._emitted and not result.events:
            result.events = ctx.events  # may be empty: none fitted in the budget
        if result.metadata:
            self._bound_metadata(result)
        if result.events or result.events is ctx.events:
            self._bound_events(result, ctx)
        if result.state_update:
            await self._apply_state(session, result, ctx)
        return result

    async def _await_under_deadline(
        self, tool: Tool, task: asyncio.Future[Any], ctx: ToolContext, timeout: float
    ) -> ToolResult:
        loop = asyncio.get_running_loop()
        initial = ctx.deadline
        # The caller waits for this future, not for the task: at the deadline a timer fails it,
        # so the wait ends at once even if the tool ignores its cancellation.
        outcome = ctx._outcome = loop.create_future()
        expiry = loop.call_later(_remaining(ctx, timeout), _expire, outcome)

        def reschedule(when: float) -> None:  # ctx.extend_deadline, e.g. on progress
            nonlocal expiry
            expiry.cancel()
            expiry = loop.call_later(max(0.0, when - time.monotonic()), _expire, outcome)

        ctx._reschedule = reschedule
        try:
            raw = await outcome
        except _Aborted as exc:
            self._abandon(task, ctx)
            return _failure(tool.name, ToolErrorCode.CANCELLED, str(exc))
        except _DeadlineReached:
            self._abandon(task, ctx)
            # One turn of the loop lets a tool that handles cancellation begin its cleanup (drop
            # a stuck connection, say) before the caller's next call can reach it.
            await asyncio.sleep(0)
            return _timed_out(tool, timeout, extended=ctx.deadline != initial)
        except asyncio.CancelledError:
            if task.done() and task.cancelled() and not _being_cancelled():
                ctx._close()  # the tool cancelled itself; the caller did not
                return _failure(tool.name, ToolErrorCode.CANCELLED, "the tool was cancelled")
            self._abandon(task, ctx)
            raise
        except Exception as exc:  # the tool's own failure (a TimeoutError of its own too)
            ctx._close()
            return _tool_failure(tool.name, exc)
        finally:
            expiry.cancel()
        ctx._close()
        return _shaped(tool.name, raw)

    def _abandon(self, task: asyncio.Future[Any], ctx: ToolContext) -> None:
        ctx._close(cancelled=True)
        task.cancel()
        if not task.done():
            self._stragglers.add(task)
            task.add_done_callback(self._straggler_done)

    def _straggler_done(self, task: asyncio.Future[Any]) -> None:
        self._stragglers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("tool finished with an error after its deadline", exc_info=True)

    def _keep_prior_events(self, spec: CallSpec, result: ToolResult) -> None:
        """A call that asked for approval and did not run its tool (denied, say) still returns
        its approval event, which was sent: every call returns the events it sent."""
        if spec.prior_events and not result.events:
            result.events = list(spec.prior_events)
            self._bound_events(result, None)

    def _bound_metadata(self, result: ToolResult) -> None:
        """Make a tool's metadata JSON as the wire carries it, or a note when its JSON is
        larger than the limit."""
        limit = self.limits.max_metadata_bytes
        size, metadata = _wire_json(result.metadata)
        if size > limit:
            metadata = {"metadata_omitted": f"{size} bytes of JSON, more than {limit}"}
            result.truncated = True
        if metadata is not result.metadata:
            result.metadata = metadata

    def _bound_events(self, result: ToolResult, ctx: ToolContext | None) -> None:
        """Keep the first of a result's events that fit in ``max_events_bytes`` (each of them
        was streamed, bounded on its own); a note says how many were left out."""
        if ctx is not None and result.events is ctx.events:  # counted as they were emitted
            fit, cut, count = ctx._events_fit, ctx._events_cut, ctx._emitted
        else:  # the approval event alone, or the events of a ToolResult the tool built
            fit, cut = _events_that_fit(result.events, self.limits.max_events_bytes), False
            count = len(result.events)
        if fit is not None:
            result.metadata = {**result.metadata, "events_omitted": count - fit}
            result.events = result.events[:fit]
        if fit is not None or cut:
            result.truncated = True

    def _bound(self, result: ToolResult) -> int:
        """Bound a result's texts and data (flagging what was cut) and make its data JSON as
        the wire carries it; return the size of its output text in bytes."""
        limit = self.limits.max_output_chars
        error = result.error
        if error is not None and len(error) > limit:
            result.error = error = _cut(error, limit, "error")
            result.truncated = True
        if result.output_text is None and error is None:
            output = _output_of_data(result, limit)
        else:
            output = _given_output(result, limit)
        try:
            if error is None or _encodable(error):
                return len(output.encode())
        except UnicodeEncodeError:
            pass
        _mend_text(result)  # no peer could be sent it, nor a store keep it
        return len(result.output.encode())

    async def _apply_state(self, session: Session, result: ToolResult, ctx: ToolContext) -> None:
        patch = result.state_update or []
        if not result.success or self.state is None:
            return
        try:
            record = await self.state.apply(session.id, patch)
        except StateError as exc:
            _state_not_applied(result, ToolErrorCode.INVALID_STATE_UPDATE, str(exc))
            return
        except Exception as exc:  # the store failed (a locked file, a lost connection)
            # The update was fine but was not kept: the call fails, retryably, and is audited.
            message = f"state update not saved, the state is unchanged: {_describe(exc)}"
            _state_not_applied(result, ToolErrorCode.TOOL_ERROR, message)
            return
        sink = ctx._sink
        event = ToolEvent(
            kind="state",
            req_id=ctx.req_id,
            data={"delta": patch, "version": record.version},
            seq=max(ctx._emitted, len(result.events)),  # after every event sent, kept or not
        )
        result.events = [*result.events, event]
        if sink is not None:
            sink(event)

    async def _audit(
        self,
        session: Session,
        spec: CallSpec,
        tool: Tool | None,
        result: ToolResult,
        decision: str,
        measured: tuple[int, str],
        *,
        source: str = "",
    ) -> None:
        """Bound the output (its size is audited), then store the call's entry."""
        output_bytes = self._bound(result)
        input_bytes, digest = measured
        entry = AuditEntry(
            tool_name=spec.tool_name,
            success=result.success,
            error_code=result.error_code,
            duration_ms=result.duration_ms,
            session_id=session.id,
            agent_id=session.agent_id,
            req_id=spec.req_id,
            correlation_id=spec.correlation_id,
            source=tool.source if tool is not None else source,
            transport=session.transport,
            input_bytes=input_bytes,
            output_bytes=output_bytes,
            args_digest=digest,
            decision=decision,
            host_id=self.host_id,
        )
        try:
            # In-process callers share the host's fate, so their entries may share a commit.
            await self.store.append_audit(entry, durable=session.transport != "inprocess")
        except Exception as exc:
            self.audit_failures += 1
            log_lost_entry(entry, exc)


_ALLOWED = Decision(True)


class _DeadlineReached(Exception):
    """Fails a call's outcome when its deadline passes (no tool raises this one)."""


class _Aborted(Exception):
    """Fails a call's outcome when ``Pipeline.abort`` ends it."""


def _expire(outcome: asyncio.Future[Any]) -> None:
    if not outcome.done():
        outcome.set_exception(_DeadlineReached())


async def _run_reporting(tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> Any:
    """Run a tool in its task and, once the pipeline waits for it (``ctx._outcome``), hand the
    outcome straight to the waiting caller: one wake-up, where awaiting the task through a
    shield takes two."""
    try:
        value = await tool._fn(arguments, ctx)  # Tool.run's body, one frame fewer
    except asyncio.CancelledError:
        if ctx._outcome is not None and not ctx._outcome.done():
            ctx._outcome.cancel()  # the tool cancelled itself
        raise
    except BaseException as exc:
        outcome = ctx._outcome
        if outcome is None or outcome.done():
            raise  # the first step's failure (read from the task), or a straggler's
        outcome.set_exception(exc)
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt, SystemExit: not the tool's to keep
        return None
    if ctx._outcome is not None and not ctx._outcome.done():
        ctx._outcome.set_result(value)
    return value


_AT_DEADLINE = "deadline"  # why _run_in_caller's timer ends a call (else: an abort's reason)


async def _run_in_caller(
    tool: Tool, arguments: dict[str, Any], ctx: ToolContext, timeout: float
) -> ToolResult:
    """Run a tool whose source promises it ends promptly when cancelled in the caller's own
    task: at the deadline (or on ``Pipeline.abort``) the task is cancelled, as
    ``asyncio.timeout`` does, and the call answers once the tool has let go."""
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - the pipeline always runs in a task
        raise RuntimeError("a tool call needs a running task")
    loop = asyncio.get_running_loop()
    initial, baseline = ctx.deadline, task.cancelling()
    ended: list[str] = []

    def end(why: str) -> None:
        if not ended and not ctx._closed:
            ended.append(why)
            task.cancel()

    expiry = loop.call_later(_remaining(ctx, timeout), end, _AT_DEADLINE)

    def reschedule(when: float) -> None:  # ctx.extend_deadline, e.g. on progress
        nonlocal expiry
        expiry.cancel()
        expiry = loop.call_later(max(0.0, when - time.monotonic()), end, _AT_DEADLINE)

    ctx._reschedule, ctx._end = reschedule, end
    try:
        try:
            raw = await tool._fn(arguments, ctx)
        finally:
            expiry.cancel()
            ctx._close(cancelled=bool(ended) or task.cancelling() > baseline)
    except asyncio.CancelledError:
        if not ended:
            if task.cancelling() > baseline:
                raise  # the caller's own cancellation
            return _failure(tool.name, ToolErrorCode.CANCELLED, "the tool was cancelled")
        if task.uncancel() > baseline:
            raise  # the caller was cancelled meanwhile too: its cancellation goes on
    except Exception as exc:  # the tool's own failure (a TimeoutError of its own too)
        if not ended:
            if task.cancelling() > baseline:  # it turned the caller's cancellation into this
                raise asyncio.CancelledError from None
            return _tool_failure(tool.name, exc)
        if task.uncancel() > baseline:  # it failed on its way out, once the pipeline ended it
            raise asyncio.CancelledError from None  # and the caller was cancelled too
    else:
        # A tool that let a cancellation go and returned: the caller's own still stands (as
        # when the tool runs in a task of its own), else the deadline's or the abort's does.
        if not ended:
            if task.cancelling() > baseline:
                raise asyncio.CancelledError
            return _shaped(tool.name, raw)
        if task.uncancel() > baseline:
            raise asyncio.CancelledError
    if ended[0] != _AT_DEADLINE:
        return _failure(tool.name, ToolErrorCode.CANCELLED, ended[0])
    return _timed_out(tool, timeout, extended=ctx.deadline != initial)


def _timed_out(tool: Tool, timeout: float, *, extended: bool) -> ToolResult:
    by_progress = " (deadline extended by progress)" if extended else ""
    return _failure(
        tool.name,
        ToolErrorCode.TIMEOUT,
        f"tool {tool.name!r} timed out after {timeout:g}s{by_progress}",
    )


def _finished(tool: Tool, task: asyncio.Future[Any], ctx: ToolContext) -> ToolResult:
    """The result of a tool that finished on its first step."""
    ctx._close()
    if task.cancelled():
        return _failure(tool.name, ToolErrorCode.CANCELLED, "the tool was cancelled")
    error = task.exception()
    if error is not None:
        if not isinstance(error, Exception):
            raise error  # KeyboardInterrupt, SystemExit: not the tool's to keep
        return _tool_failure(tool.name, error)
    return _shaped(tool.name, task.result())


def _tool_failure(tool_name: str, exc: Exception) -> ToolResult:
    """A tool's exception as its result. ``ArgumentError`` says the arguments were wrong (a
    model's own validator refused them, or the tool said so): ``invalid_arguments``, at a path."""
    if isinstance(exc, ArgumentError):
        result = _failure(tool_name, ToolErrorCode.INVALID_ARGUMENTS, str(exc))
        result.metadata = {"path": exc.path}
        return result
    return _failure(tool_name, ToolErrorCode.TOOL_ERROR, _describe(exc))


def _remaining(ctx: ToolContext, timeout: float) -> float:
    """Seconds left to the deadline (which the tool may already have moved)."""
    return timeout if ctx.deadline is None else max(0.0, ctx.deadline - time.monotonic())


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _observed(
    observers: Sequence[CallObserver],
    session: Session,
    spec: CallSpec,
    on_event: EventSink | None,
) -> EventSink:
    """An event sink that also shows every event to the observers (and streams it on)."""

    forward = on_event if spec.streaming else None  # the caller's own choice stands

    def sink(event: ToolEvent) -> None:
        for observer in observers:
            observer.call_event(session, spec, event)
        if forward is not None:
            forward(event)

    spec.streaming = True  # the observers need the events even when the caller did not ask
    return sink


def _elapsed_ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _failure(tool_name: str, code: ToolErrorCode, message: str) -> ToolResult:
    return ToolResult.failure(tool_name, code, message)


def _mend_text(result: ToolResult) -> None:
    """Replace lone surrogates by U+FFFD everywhere in ``result``, so it can be encoded."""
    result.data = mend_text(result.data)
    if result.output_text is not None:
        result.output_text = mend_text(result.output_text)
    if result.error is not None:
        result.error = mend_text(result.error)
    result.metadata = mend_text(result.metadata)
    for event in result.events:
        event.data = mend_text(event.data)


# derive_output's JSON text (json.dumps with the same options), refusing NaN and infinity: the
# encoding that makes a result's output text is how the pipeline finds them, at no extra cost.
_strict_json = strictjson.encoder()


def _finite_json(value: Any) -> tuple[str, Any]:
    """The JSON text of ``value`` (plain JSON data) and the value it is of: ``value`` itself, or
    when it holds NaN or infinity a copy with null for them, as JSON.stringify writes them, so
    the result in-process, its output text and the wire agree."""
    try:
        return _strict_json(value), value
    except ValueError:
        finite = to_jsonable_python(value, inf_nan_mode="null")
        return _strict_json(finite), finite


def _wire_json(value: Any) -> tuple[int, Any]:
    """The size in bytes of ``value`` (plain JSON data) as the wire writes it, and the value
    it is of: ``value`` itself, or a copy with a lone surrogate made U+FFFD, NaN and infinity
    null. (pydantic's encoder, several times json's speed, writes them as NaN and Infinity:
    where neither word appears, as in nearly every value, there is none.)"""
    try:
        encoded = to_json(value)
    except PydanticSerializationError:  # a lone surrogate: no UTF-8 can carry it
        value = jsonable(mend_text(value))
        encoded = to_json(value)
    if b"NaN" in encoded or b"Infinity" in encoded:  # maybe in a text only: this decides
        value = _finite_json(value)[1]
        encoded = to_json(value)
    return len(encoded), value


def _output_of_data(result: ToolResult, limit: int) -> str:
    """The output a result derives from its data, bounded: text data is cut, structured data
    too long to show is dropped with a note (its cut JSON is then the output)."""
    data = result.data
    if data is None:
        return ""
    if isinstance(data, str):
        if len(data) > limit:
            result.data = data = _cut(data, limit, "output")
            result.truncated = True
        return data
    text, finite = _finite_json(data)
    if finite is not data:
        result.data = finite
        if finite is None:  # the data was NaN or infinity: null, and no output at all
            return ""
    if len(text) <= limit:
        return text
    result.output = output = _cut(text, limit, "output")
    _omit_data(result)
    return output


def _given_output(result: ToolResult, limit: int) -> str:
    """The output of a result with a text of its own (or its error's, cut already), bounded,
    and its data, which is not that text, bounded on its own (as JSON bytes, not characters,
    which only ever cuts it sooner)."""
    output = result.output_text
    if output is not None and len(output) > limit:
        result.output_text = output = _cut(output, limit, "output")
        result.truncated = True
    data = result.data
    if isinstance(data, str):
        if len(data) > limit:
            result.data = _cut(data, limit, "data")
            result.truncated = True
    elif data is not None:
        size, plain = _wire_json(data)
        if plain is not data:
            result.data = plain
        if size > limit:
            _omit_data(result)
    return output if output is not None else result.error or ""


def _cut(text: str, limit: int, what: str) -> str:
    return f"{text[:limit]}\n[{what} truncated: {limit} of {len(text)} characters shown]"


def _omit_data(result: ToolResult) -> None:
    result.data = None
    result.metadata = {**result.metadata, "data_omitted": "larger than the output limit"}
    result.truncated = True


def _encodable(text: str | None) -> bool:
    """Whether ``text`` can be written as UTF-8 (it holds no lone surrogate)."""
    if text is None or text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _events_that_fit(events: Sequence[ToolEvent], budget: int) -> int | None:
    """How many of the first ``events`` fit in ``budget``; None when they all do."""
    for index, event in enumerate(events):
        budget -= event_cost(event, event_data_size(event.data))
        if budget < 0:
            return index
    return None


def _state_not_applied(result: ToolResult, code: ToolErrorCode, message: str) -> None:
    result.success = False
    result.error_code = code
    result.error = message
    # Not sent back: a refused update may hold what no peer can read (a Python object, a lone
    # surrogate, nesting too deep), and the response carrying it would never arrive.
    result.state_update = None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _shaped(tool_name: str, raw: Any) -> ToolResult:
    """``_shape``, where a value that cannot become a result is the tool's failure."""
    try:
        return _shape(tool_name, raw)
    except Exception as exc:
        message = f"the tool returned a value that cannot be a result: {_describe(exc)}"
        return _failure(tool_name, ToolErrorCode.TOOL_ERROR, message)


def _shape(tool_name: str, raw: Any) -> ToolResult:
    """Turn whatever a tool returned into its ToolResult."""
    if isinstance(raw, ToolResult):
        raw.tool_name = tool_name  # the name it was called by (a source may not know its prefix)
        refusal = _not_operations(raw.state_update)
        if refusal:
            return _failure(tool_name, ToolErrorCode.INVALID_STATE_UPDATE, refusal)
        # A result built by hand may hold what JSON cannot (an object in its metadata): made
        # JSON here, as a returned value is, so the peer and the audit see the same outcome.
        raw.data = jsonable(raw.data)
        if raw.metadata:
            raw.metadata = jsonable(raw.metadata)
        return raw
    if isinstance(raw, Output):
        refusal = _not_operations(raw.state_update)
        if refusal:
            return _failure(tool_name, ToolErrorCode.INVALID_STATE_UPDATE, refusal)
        return ToolResult(
            success=True,
            tool_name=tool_name,
            data=jsonable(raw.value),
            output_text=raw.text,
            metadata=jsonable(raw.metadata) if raw.metadata else {},
            state_update=raw.state_update,
            duration_ms=0,
        )
    return ToolResult(success=True, tool_name=tool_name, data=jsonable(raw), duration_ms=0)


def _not_operations(update: object) -> str:
    """Why ``update`` cannot be a state update (an RFC 6902 patch: a list of operation
    objects), or "" when it can be one (whether each operation is right is the state's to say)."""
    if update is None:
        return ""
    if not isinstance(update, list | tuple):
        hint = " (put one operation in a list: [{...}])" if isinstance(update, dict) else ""
        return (
            "a state update must be a list of RFC 6902 operations, "
            f"not {type(update).__name__}{hint}"
        )
    for index, operation in enumerate(update):
        if not isinstance(operation, dict):
            return (
                f"state_update[{index}]: an operation must be an object with 'op' and 'path', "
                f"not {type(operation).__name__}"
            )
    return ""


def jsonable(value: Any) -> Any:
    """A JSON-compatible form of a tool's return value (models, dataclasses, enums, ...)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    try:
        return to_jsonable_python(value, fallback=str)
    except UnicodeDecodeError:  # bytes that are not UTF-8 text: standard base64
        return to_jsonable_python(_base64_bytes(value), fallback=str)


def _base64_bytes(value: Any) -> Any:
    """``value`` with its bytes as standard base64 text (pydantic's own is the URL-safe kind,
    which ``base64.b64decode`` would misread without a word)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {key: _base64_bytes(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_base64_bytes(item) for item in value]
    return value
