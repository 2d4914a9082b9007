"""The tasks of a served agent: the running ones in memory, every one in the store.

A task is kept as its A2A 1.0 JSON document. It is written to the store when it is created and
when it reaches a final (or interrupted) state, so a restarted server still answers ``GetTask``
for it; a task the store holds as running but that no longer runs here was cut short by a
restart and is reported (and recorded) as failed. With a store shared by hosts, each write
records the host that made it (the one running the task): a task whose host is gone (it stopped
saying it is alive, see ``A2AServer.start``) is reported and recorded as failed so too, through
whichever host reads it; while its host lives it is reported as stored. A task whose creator
waits for its end (a blocking ``SendMessage`` on a store of this host alone) is first written
when it ends or pauses: until then nobody else knows its id, and a listing of tasks writes any
such task first. Streaming listeners get every status and artifact update of a running task, in
order.

A task's first recorded end is final (the store keeps it): when hosts sharing the store end a
task together (one completes it, another cancels it), the one whose write came second takes the
stored end as the task's, for its answer, its listeners and its caches. A host that finds an end
stored for a task it still runs (a write refused, a listing, a lookup) takes it as the cancel
notice it missed, and stops the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from toolmesh.a2a import wire
from toolmesh.capabilities import CapabilitySet
from toolmesh.llm.styles import ChatMessage
from toolmesh.sources.skills import Skill
from toolmesh.store.base import A2ATaskRecord, Store

__all__ = ["HOST_STOPPED", "RESTARTED", "RunningTask", "TaskBoard", "status_update"]

logger = logging.getLogger("toolmesh.a2a.tasks")
JsonObject = dict[str, Any]
RESTARTED = "the server restarted before the task finished"
HOST_STOPPED = "the host running the task stopped before the task finished"
CONTEXT_TASKS = 50  # earlier tasks of a context the model sees as conversation history


@dataclass(eq=False)
class RunningTask:
    """A task this server is working on."""

    doc: JsonObject
    prompt: str
    skill: Skill | None = None
    history: list[ChatMessage] = field(default_factory=list)
    job: asyncio.Future[None] | None = None
    listeners: list[asyncio.Queue[JsonObject]] = field(default_factory=list)
    snapshot: JsonObject = field(default_factory=dict)  # the task as its stream starts
    approval: asyncio.Future[bool] | None = None  # an approval the task waits for (input-required)
    asking: asyncio.Lock | None = None  # held by the call whose approval is asked (one at a time)
    paused: bool = False  # True while it waits for input
    capabilities: CapabilitySet | None = None  # the client's override, when the policy allows
    stored: bool = False  # written to the store at least once
    ending: str = ""  # the final state being recorded (``doc`` shows it once it is stored)
    resumes: JsonObject | None = None  # the interrupted task a reply resumes, as it was read
    _settle_waiters: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.doc["id"])

    @property
    def state(self) -> str:
        return wire.task_state(self.doc)

    def settled(self) -> asyncio.Future[None]:
        """Done once the task's job ends or the task pauses for input (one future: no task)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.job is None or self.job.done() or self.paused:
            waiter.set_result(None)
            return waiter
        self._settle_waiters.append(waiter)
        self.job.add_done_callback(lambda _job: self._wake())
        return waiter

    def stop(self) -> bool:
        """Stop the job, as a cancel does (it ends canceled, or with the end the store holds):
        not a job whose end is being written, nor one that is over. Whether it was stopped.
        A job stopping itself (from inside a save it awaits) is cancelled at its next await."""
        job = self.job
        if job is None or job.done() or self.ending:
            return False
        job.cancel()
        return True

    def pause(self, paused: bool = True) -> None:
        """Mark the task as waiting for input (or no longer); a pause settles it."""
        self.paused = paused
        if paused:
            self._wake()

    def _wake(self) -> None:
        waiters, self._settle_waiters = self._settle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def listen(self) -> asyncio.Queue[JsonObject]:
        queue: asyncio.Queue[JsonObject] = asyncio.Queue()
        self.listeners.append(queue)
        return queue

    def publish(self, item: JsonObject) -> None:
        for queue in self.listeners:
            queue.put_nowait(item)

    def status(self, state: str, text: str = "") -> JsonObject:
        """A status of this task: ``state``, with an agent message when ``text``."""
        status: JsonObject = {"state": wire.state_name(state), "timestamp": wire.timestamp()}
        if text:
            status["message"] = wire.message(
                "agent", text, context_id=self.doc["contextId"], task_id=self.id
            )
        return status

    def set_status(self, state: str, text: str = "") -> JsonObject:
        """Move to ``state`` (with an agent message when ``text``) and tell the listeners."""
        status = self.doc["status"] = self.status(state, text)
        self.publish(status_update(self.doc))
        return status


def status_update(doc: JsonObject) -> JsonObject:
    """The stream item telling a task's current status."""
    update = {"taskId": doc["id"], "contextId": doc["contextId"], "status": doc["status"]}
    return {"statusUpdate": update}


def approval_of(doc: JsonObject) -> JsonObject | None:
    """The approval an input-required task's status asks for, if that is what it waits for."""
    status = doc.get("status")
    message = status.get("message") if isinstance(status, dict) else None
    metadata = message.get("metadata") if isinstance(message, dict) else None
    approval = metadata.get("approval") if isinstance(metadata, dict) else None
    return approval if isinstance(approval, dict) else None


class TaskBoard:
    """Finds, creates and records the tasks of one served agent."""

    def __init__(self, store: Store, *, cache_size: int = 1024) -> None:
        self.store = store
        self.host_id = ""
        """This host's id among the hosts sharing the store (set by ``A2AServer.start``), which
        it records with every task it writes; "": none recorded, nor any host judged gone."""
        self.running: dict[str, RunningTask] = {}
        self.unwritten: dict[str, JsonObject] = {}
        """Ends of tasks that could not be recorded as they ended, by task id (written again
        by the server until they are; this host answers with them meanwhile)."""
        self._recent: OrderedDict[str, JsonObject] = OrderedDict()
        self._cache_size = cache_size

    async def get(self, task_id: str) -> JsonObject | None:
        """A task's current document (None when unknown). With a shared store a task running
        here is looked up too: one another host ended (its cancel notice lost) is stopped, and
        its stored end is the answer."""
        running = self.running.get(task_id)
        if running is not None:
            if self.store.shared and not running.ending:
                try:
                    record = await self.store.load_a2a_task(task_id)
                except Exception as exc:  # the store is away: this host's copy, as before
                    logger.warning("could not look task %s up in the store: %s", task_id, exc)
                    return running.doc
                if record is not None and record.state in wire.TERMINAL:
                    running.stop()
                    return record.document
            return running.doc
        doc = self.unwritten.get(task_id) or self._recent.get(task_id)
        if doc is not None:
            return doc
        record = await self.store.load_a2a_task(task_id)
        if record is None:
            return None
        return await self._settled(record.document)

    async def _settled(self, doc: JsonObject) -> JsonObject:
        [settled] = await self._settle([doc])
        return settled

    async def _settle(self, docs: list[JsonObject]) -> list[JsonObject]:
        """Stored tasks that do not run here, as they stand: one that will never go on is failed
        (recorded so, unless an end is stored first: that end stands). On a store of this host
        alone, that is one left running by an earlier server; on a shared store, one whose host
        is gone (while its host lives, another host may be running it)."""
        unfinished = [n for n, doc in enumerate(docs) if _unfinished(doc)]
        if not unfinished:
            return docs
        if self.store.shared:
            ids = {str(docs[n]["id"]) for n in unfinished}
            try:
                gone, text = await self.store.orphaned_a2a_tasks(ids, self.host_id), HOST_STOPPED
            except Exception as exc:  # the store is away: as stored (judged at the next read)
                logger.warning("could not tell whether tasks' hosts are alive: %s", exc)
                return docs
        else:
            gone, text = {str(docs[n]["id"]) for n in unfinished}, RESTARTED
        settled = list(docs)
        for n in unfinished:
            if str(docs[n]["id"]) in gone:
                settled[n] = await self.save(_failed(docs[n], text))
        return settled

    async def save(self, doc: JsonObject, *, expected: JsonObject | None = None) -> JsonObject:
        """Record ``doc``; the task as the store now holds it: ``doc`` itself, or the end the
        store already had (another host ended the task first), which stands instead. With
        ``expected`` (the task as it was read), ``doc`` is written only while the store still
        holds that (a compare-and-set: how a reply resumes an interrupted task); otherwise
        the task as the store holds it is returned: an end, or another reply's resumption.

        A task running here that the store holds as ended was ended through another host (a
        cancel whose notice did not reach this host): its job is stopped, as the notice would
        have stopped it, and ends with the stored end. A write of the job's own end (while it
        is ``ending``) stops nothing: that end is told instead (see ``A2AServer._finish``)."""
        task_id = doc["id"]
        state = wire.task_state(doc)
        record = A2ATaskRecord(task_id, doc.get("contextId", ""), state, _status_time(doc), doc)
        if expected is None:
            written = await self.store.save_a2a_task_on(record, self.host_id)
        else:
            was = A2ATaskRecord(
                task_id,
                expected.get("contextId", ""),
                wire.task_state(expected),
                _status_time(expected),
                expected,
            )
            written = await self.store.replace_a2a_task_on(record, self.host_id, was)
        running = self.running.get(task_id)
        if running is not None and running.doc is doc:
            running.stored = True
        if self.unwritten.get(task_id) is doc:
            del self.unwritten[task_id]
        if not written:
            kept = await self.store.load_a2a_task(task_id)
            if kept is None:  # it refused the write for a task it holds: tasks are never deleted
                raise RuntimeError(f"the store refused to replace task {task_id!r}, then lost it")
            doc, state = kept.document, kept.state
            if running is not None and state in wire.TERMINAL:
                running.stop()
        # An ended task never changes again: kept at hand. An interrupted one goes on through
        # whichever host gets the reply: with a shared store it is read afresh each time.
        if state in wire.TERMINAL or (state in wire.INTERRUPTED and not self.store.shared):
            self._remember(doc)
        return doc

    async def store_running(self) -> None:
        """Write the running tasks not written yet, and the ends not recorded yet, before the
        store is read for a listing."""
        for running in [r for r in self.running.values() if not r.stored]:
            await self.save(running.doc)
        await self.store_unwritten()

    async def store_unwritten(self) -> None:
        """Record the ends that could not be as their tasks ended (raises while the store is
        away: those left are tried again)."""
        for doc in list(self.unwritten.values()):
            await self.save(doc)

    def _remember(self, doc: JsonObject) -> None:
        self._recent[doc["id"]] = doc
        self._recent.move_to_end(doc["id"])
        while len(self._recent) > self._cache_size:
            self._recent.popitem(last=False)

    async def page(
        self, *, context_id: str, state: str, updated_after: float, limit: int, offset: int
    ) -> tuple[list[JsonObject], int]:
        await self.store_running()
        records, total = await self.store.list_a2a_tasks(
            context_id=context_id,
            state=state,
            updated_after=updated_after,
            limit=limit,
            offset=offset,
        )
        docs: list[JsonObject] = []
        left: list[int] = []  # stored as going on, and not running here: settled below
        for record in records:
            running = self.running.get(record.task_id)
            if record.state in wire.TERMINAL:  # its end, which stands
                if running is not None:  # ended through another host while it runs here (its
                    running.stop()  # notice lost): stopped, as the notice would have
                docs.append(record.document)
            elif running is not None:
                docs.append(running.doc)
            else:
                left.append(len(docs))
                docs.append(record.document)
        for n, doc in zip(left, await self._settle([docs[n] for n in left]), strict=True):
            docs[n] = doc
        return docs, total

    async def conversation(self, context_id: str) -> list[ChatMessage]:
        """The earlier exchanges of a context, oldest first, as the model's history: those of
        its completed tasks. A task still running or waiting for input holds a question with no
        answer yet (the model would answer it in the wrong task), and one that failed, was
        canceled or rejected holds one that was never answered."""
        records, _total = await self.store.list_a2a_tasks(
            context_id=context_id, state="completed", limit=CONTEXT_TASKS
        )
        history: list[ChatMessage] = []
        for record in reversed(records):
            for message in record.document.get("history") or []:
                text = wire.text_of(message.get("parts"))
                if text:
                    agent = wire.is_agent(message)
                    history.append(ChatMessage("assistant" if agent else "user", text))
        return history

    def forget(self, running: RunningTask) -> None:
        self.running.pop(running.id, None)
        self._remember(running.doc)


def _unfinished(doc: JsonObject) -> bool:
    """Whether a stored task would go on only in the job running it: one working (or about to),
    or waiting for an approval (its answer goes to the job that asked). A task waiting for its
    caller's input goes on through whichever host gets the reply."""
    state = wire.task_state(doc)
    if state in wire.INTERRUPTED:
        return approval_of(doc) is not None
    return state not in wire.TERMINAL


def _failed(doc: JsonObject, text: str) -> JsonObject:
    """``doc`` failed, with ``text`` as the agent's message (naming the approval it waited
    for: a reply now could only start a new run, without the call it was meant for)."""
    approval = approval_of(doc) if wire.task_state(doc) in wire.INTERRUPTED else None
    if approval is not None:
        text += f" (the call of {approval.get('toolName', 'a tool')!r} was waiting for approval)"
    status = {
        "state": wire.state_name("failed"),
        "timestamp": wire.timestamp(),
        "message": wire.message(
            "agent", text, context_id=doc.get("contextId", ""), task_id=doc["id"]
        ),
    }
    return {**doc, "status": status}


def _status_time(doc: JsonObject) -> float:
    """When the task's status last changed (its ``status.timestamp``), as epoch seconds: the
    time tasks are listed by and ``statusTimestampAfter`` filters on. Now, without one."""
    status = doc.get("status")
    stamp = status.get("timestamp") if isinstance(status, dict) else None
    if isinstance(stamp, str):
        with contextlib.suppress(ValueError):
            return wire.parse_timestamp(stamp)
    return time.time()
