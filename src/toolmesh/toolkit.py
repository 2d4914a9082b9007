"""The Toolkit: tools from several sources, assembled, de-duplicated, searchable and callable.

Assembly walks the sources in the order they were added. Every name is made legal for every
model provider (``[A-Za-z0-9_-]``, at most 64 characters). When two tools want one name, the first
keeps it and a ``ToolNameConflict`` warning names both sources (by place too, ``#2``, when they
share a name), or the toolkit refuses with ``NameConflictError`` when created with
``on_conflict="error"``. A refusal changes nothing: a refused ``add`` or ``register`` leaves the
toolkit as it was, and after a refused source change it serves its last good assembly,
assembling afresh at every later change (and refusing again) until the clash is gone. A tool
stays reachable under its original name too, so an A2E client can call ``fs.read`` even though
models see ``fs_read``.

``execute`` runs a call through the same pipeline every transport uses (policy, validation,
deadline, events, state, audit).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import hashlib
import inspect
import itertools
import logging
import operator
import re
import unicodedata
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from toolmesh.capabilities import ALL, CapabilityPolicy, CapabilitySet, string_list
from toolmesh.errors import ConfigError, NameConflictError, ProtocolError, ToolNameConflict
from toolmesh.models import ToolDefinition, ToolEvent, ToolResult, new_id
from toolmesh.pipeline import (
    ApprovalRequest,
    Approver,
    CallSpec,
    Limits,
    Pipeline,
    PolicyHook,
    ToolResolver,
    ask,
)
from toolmesh.protocol import DEFAULT_MAX_MESSAGE_BYTES, ErrorCode
from toolmesh.session import Session
from toolmesh.sources.base import Source, ToolSet
from toolmesh.sources.functions import tool as function_tool
from toolmesh.sources.plugin import PluginSource, ToolPlugin
from toolmesh.sources.wrappers import Prefixed
from toolmesh.state import StateManager
from toolmesh.store import MemoryStore, Store, open_store
from toolmesh.tools import Tool

if TYPE_CHECKING:
    from toolmesh.search import SearchIndex, SearchMode
    from toolmesh.serving import ServeHandle
    from toolmesh.sources.skills import Skill

__all__ = ["ToolNameConflict", "Toolkit", "create_toolkit", "sanitize_name"]

logger = logging.getLogger("toolmesh.toolkit")

NAME_LIMIT = 64
_ILLEGAL = re.compile(r"[^A-Za-z0-9_-]")
_LEGAL = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")

OnConflict = Literal["warn", "error"]
SourceLike: TypeAlias = "Source | ToolPlugin | Tool | Callable[..., Any] | Toolkit"


def sanitize_name(name: str) -> str:
    """A name every provider accepts: ``[A-Za-z_][A-Za-z0-9_-]{0,63}`` (Gemini wants a letter or
    ``_`` first). Accents are dropped ("héllo" -> "hello"); a name with letters no ASCII spells
    ("天气", "погода"), or too long, keeps a hash suffix, so distinct names stay distinct."""
    if _LEGAL.fullmatch(name):
        return name  # nearly every name: nothing to do
    text = name
    if not text.isascii():
        decomposed = unicodedata.normalize("NFKD", text)
        text = "".join(c for c in decomposed if not unicodedata.combining(c))
    lossy = not text.isascii()  # letters replaced by "_": two names could become one
    clean = _ILLEGAL.sub("_", text) or "tool"
    if lossy and not any(c.isalnum() for c in clean):
        clean = "tool"  # "___" says nothing; the suffix tells the names apart
    if not (clean[0].isascii() and clean[0].isalpha()) and clean[0] != "_":
        clean = "_" + clean  # "1password" -> "_1password"
    if lossy or len(clean) > NAME_LIMIT:
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass"), usedforsecurity=False)
        clean = f"{clean[: NAME_LIMIT - 9]}_{digest.hexdigest()[:8]}"
    return clean


@dataclass(slots=True)
class _Entry:
    tool: Tool  # under its public name
    source: Source
    original: str  # the name its source gave it
    given: Tool  # the object its source gave, to notice when it changes


@dataclass(slots=True)
class _Offer:
    """The tools a source listed when last read, to tell what its next change did."""

    tools: list[Tool] = field(default_factory=list)  # (holding them keeps their ids theirs)
    publics: dict[int, str] = field(default_factory=dict)  # id(tool) -> its public name


class Toolkit(ToolResolver):
    """Tools from many sources behind one name space, one search index and one pipeline."""

    def __init__(
        self,
        *sources: SourceLike | Sequence[SourceLike],
        name: str = "toolmesh",
        on_conflict: OnConflict = "warn",
        capabilities: Sequence[str] | None = None,
        capability_policy: CapabilityPolicy = "locked",
        store: Store | str | Path | None = None,
        limits: Limits | None = None,
        hooks: Sequence[PolicyHook] = (),
        state_paths: Sequence[str] = ("/context/",),
        search: SearchMode | SearchIndex = "lexical",
        tool_search: bool = False,
        defer_above: int | None = None,
        keep_active: Sequence[str] = (),
    ) -> None:
        """``search`` ranks with "lexical" BM25F or "hybrid" (plus embeddings: the ``semantic``
        extra). ``defer_above`` is a token budget for the default listing: above it the least
        important tools are deferred (found by search), keeping ``keep_active`` (name globs) and
        then tools in the order they were added. ``tool_search`` adds the ``tool_search`` tools
        for models that reach the toolkit without an agent loop or MCP server of toolmesh (those
        have their own). See docs/search.md."""
        if on_conflict not in ("warn", "error"):
            raise ConfigError(f"on_conflict must be 'warn' or 'error', not {on_conflict!r}")
        if capability_policy not in ("locked", "extensible"):
            raise ConfigError(
                f"capability_policy must be 'locked' or 'extensible', not {capability_policy!r}"
            )
        self.name = name
        self.on_conflict: OnConflict = on_conflict
        self.capabilities = CapabilitySet([ALL] if capabilities is None else capabilities)
        self.capability_policy: CapabilityPolicy = capability_policy
        self.store = open_store(store)
        self.state = StateManager(
            self.store, allowed_prefixes=string_list(state_paths, where="state_paths")
        )
        self.pipeline = Pipeline(
            self, store=self.store, state=self.state, limits=limits, hooks=hooks
        )
        self.session = Session(capabilities=self.capabilities, agent_id="local")
        self._sources: list[Source] = []
        self._watchers: list[Callable[[], None]] = []  # toolkits that hold this one as a source
        self._entries: dict[str, _Entry] = {}
        self._aliases: dict[str, str] = {}
        self._offers: dict[int, _Offer] = {}  # by id(source)
        self._wanted: dict[str, int] = {}  # public name -> how many listed tools want it
        self._contested: set[str] = set()  # the names wanted more than once
        # A source change was refused (or failed): the sources list what the toolkit does not
        # serve, so every change assembles afresh until one assembles whole.
        self._stale = False
        # The index is made, and its module imported, at the first search; changes wait for
        # it too: a host that never searches (most stdio servers) never pays for tokenizing
        # and stemming every tool, and bursts of changes (an MCP server's list_changed) are
        # applied together, still incrementally.
        self._search_mode = search
        self._index_made: SearchIndex | None = None
        if not isinstance(search, str) or search not in ("lexical", "hybrid"):
            self._index_made = _create_index(search)  # an index given, or a wrong mode: raises
        self._unindexed: dict[str, ToolDefinition | None] = {}
        self.defer_above = defer_above
        self.keep_active = tuple(string_list(keep_active, where="keep_active"))
        self._over_budget: dict[str, tuple[Tool, Tool]] = {}  # name -> (as given, deferred)
        self._token_costs: dict[int, tuple[Tool, int]] = {}
        self._budget_used = 0  # tokens of the tools the budget keeps listed
        self._budget_basis: tuple[int, tuple[str, ...]] | None = None  # what they were weighed by
        self._version = 0
        self._listings: dict[tuple[Any, ...], list[ToolDefinition]] = {}
        self._warned: set[tuple[str, str, str]] = set()
        self._started = False
        self._start_lock = asyncio.Lock()
        self._closed = False
        self._calls: dict[int, CallSpec] = {}  # execute() calls running, by id()
        self._calls_done: asyncio.Event | None = None  # set when the last of them ends
        if tool_search:
            from toolmesh.sources.tool_search import ToolSearchSource

            self.add(ToolSearchSource(self))
        items = _flattened(sources)
        try:
            for item in items:
                self.add(item)
        except BaseException:
            self._let_go(items)
            raise

    def _let_go(self, given: Sequence[Any]) -> None:
        """Refused as it was made: nobody holds this toolkit, so the sources it has must not
        go on telling it of their changes (it would refuse them still, raising into their
        changes), nor the toolkits given (``given``) keep a source of it."""
        toolkits = {id(item) for item in given if isinstance(item, Toolkit)}
        for source in self._sources:
            source.unsubscribe(self._source_changed)
            if isinstance(source, ToolkitSource) and id(source.toolkit) in toolkits:
                source.unwatch()

    # -- assembly --------------------------------------------------------------------------------

    def add(self, item: SourceLike | Sequence[SourceLike], *, prefix: str | None = None) -> Source:
        """Add a source (or a plugin, tool, function, toolkit, or a list of these)."""
        made = source = as_source(item)
        if prefix:
            source = Prefixed(made, prefix)
        # A refusal comes before anything changed: the source is neither kept nor subscribed.
        claims: tuple[Sequence[Tool], list[str]] | None = None
        try:
            if self._stale:  # what every source lists now, and this one too, or nothing
                self._assemble([*self._sources, source])
            else:
                tools = source.tools()
                claims = (tools, self._names_for(source, tools))
        except BaseException:
            if made is not item and isinstance(made, ToolkitSource):
                made.unwatch()  # made here for a toolkit, which must not go on telling it
            raise
        source.subscribe(self._source_changed)  # before a watcher of this toolkit can raise
        if isinstance(made, ToolkitSource) and (own := made.toolkit.own_settings()):
            logger.warning(
                "toolkit %r is a source of toolkit %r, which governs its tools: its own %s do "
                "not apply to them",
                made.toolkit.name,
                self.name,
                ", ".join(own),
            )
        if claims is None:
            self._after_change(None)
        else:
            self._sources.append(source)
            self._offers[id(source)] = _Offer()
            self._append(source, *claims)
        return source

    def register(self, *tools: Tool | Callable[..., Any]) -> list[Tool]:
        """Add tools (or functions) after everything already registered; first name wins."""
        made = [t if isinstance(t, Tool) else function_tool(t) for t in tools]
        last = self._sources[-1] if self._sources else None
        if not (isinstance(last, ToolSet) and last.name == "registered"):
            self.add(ToolSet(made, name="registered"))
        elif self._sources.count(last) == 1 and not self._stale:
            publics = self._names_for(last, made)  # refused: not one of them is kept
            last._tools.extend(made)  # appending at the end cannot displace an earlier tool
            self._append(last, made, publics)
        else:  # added again (its tools come first where it was first added), or stale
            kept = len(last._tools)
            last._tools.extend(made)
            try:
                self._assemble(self._sources)
            except BaseException:
                del last._tools[kept:]  # refused: a later register must not bring them back
                raise
            self._after_change(None)
        return made

    def _names_for(self, source: Source, tools: Sequence[Tool]) -> list[str]:
        """The public names of ``tools``, to be claimed after all the others. With
        ``on_conflict="error"`` the first that cannot be is refused here, before anything
        changed (at the cost of these tools only)."""
        publics = [sanitize_name(tool.name) for tool in tools]
        if self.on_conflict == "error":
            ahead: dict[str, Tool] = {}  # the earlier of these, by public name
            for tool, public in zip(tools, publics, strict=True):
                holder = self._entries.get(public)
                if holder is None and public in ahead:
                    holder = _Entry(ahead[public], source, ahead[public].name, ahead[public])
                if holder is not None:
                    self._conflict(holder, source, tool.name, public)
                ahead[public] = tool
        return publics

    def _append(self, source: Source, tools: Sequence[Tool], publics: list[str]) -> None:
        """Claim the tools ``source`` lists after all the others (it is the last source)."""
        self._note(self._offers[id(source)], tools, publics)
        appended = []
        for tool, public in zip(tools, publics, strict=True):
            entry = self._claim(source, tool, public)
            if entry is not None:
                appended.append(entry)
        self._after_change(appended)

    def _note(self, offer: _Offer, tools: Sequence[Tool], publics: list[str]) -> None:
        """Record that the source of ``offer`` lists ``tools`` too, under ``publics``."""
        offer.tools.extend(tools)
        offer.publics.update(zip(map(id, tools), publics, strict=True))
        for public in publics:
            self._want(public, 1)

    def _want(self, public: str, change: int) -> None:
        wanted = self._wanted.get(public, 0) + change
        if wanted:
            self._wanted[public] = wanted
        else:
            del self._wanted[public]
        if wanted > 1:
            self._contested.add(public)
        else:
            self._contested.discard(public)

    def _after_change(self, appended: list[_Entry] | None) -> None:
        """What every change ends with. ``appended``: the entries it added after all the others
        when it changed nothing else, or None."""
        self._version += 1
        self._listings.clear()
        self._defer_over_budget(appended)
        self._tell_watchers()

    def _tell_watchers(self) -> None:
        """Tell the toolkits this one is a source of that its tools changed: they hold its
        tools, and must not keep serving one it dropped, or as it was before it changed. One
        that refuses the change does not keep the others from hearing of it; its error is
        raised once they have."""
        failure: Exception | None = None
        for watcher in list(self._watchers):
            try:
                watcher()
            except Exception as exc:
                failure = exc if failure is None else failure
        if failure is not None:
            raise failure

    def _claim(
        self,
        source: Source,
        given: Tool,
        public: str,
        previous: Mapping[str, _Entry] | None = None,
    ) -> _Entry | None:
        """Give ``given`` its public name unless an earlier tool holds it; its entry, if so."""
        original = given.name
        holder = self._entries.get(public)
        if holder is not None:
            self._conflict(holder, source, original, public)
            return None
        if public != original:
            self._aliases.setdefault(original, public)
        old = previous.get(public) if previous is not None else None
        if old is not None and old.source is source and old.given is given:
            self._entries[public] = old  # unchanged: the index entry stays as it is
            return old
        tool = given if public == original else given.replace(name=public)
        entry = self._entries[public] = _Entry(tool, source, original, given)
        self._unindexed[public] = tool.definition if _searchable(tool) else None
        return entry

    def _conflict(self, holder: _Entry, source: Source, original: str, public: str) -> None:
        renamed = f" (made legal as {public!r})" if original != public else ""
        loser, keeper = self._told_apart(source, holder.source)
        message = (
            f"tool name {public!r} is taken: {original!r}{renamed} from source {loser} is "
            f"ignored; {holder.original!r} from source {keeper} keeps it"
        )
        if self.on_conflict == "error":
            raise NameConflictError(message)
        key = (public, keeper, loser)
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)
            warnings.warn(message, ToolNameConflict, stacklevel=4)

    def _told_apart(self, source: Source, other: Source) -> tuple[str, str]:
        """The two sources as a conflict names them: by name, and when two sources have one
        name (two ``@tool`` functions named "a" are both "tool:a") by place too, ``#2``."""
        if source is other or source.name != other.name:
            return repr(source.name), repr(other.name)
        return f"#{self._place(source)} {source.name!r}", f"#{self._place(other)} {other.name!r}"

    def _place(self, source: Source) -> int:
        """Where ``source`` is among the sources, counted from 1; one being added (not among
        them yet) comes after them all."""
        for place, each in enumerate(self._sources, 1):
            if each is source:
                return place
        return len(self._sources) + 1

    def _source_changed(self, source: Source) -> None:
        """Re-assemble after a source changed its tools: only where it changed when no other
        source has a say (``_change_in_place``), else walking every source again; the index
        changes only where tools did (an earlier source losing a tool can hand its name to a
        later one)."""
        if self._change_in_place(source):
            return
        try:
            self._assemble(self._sources)
        except BaseException:
            # The change cannot be undone (it is the source's): the last good assembly is
            # served, and every change is assembled afresh until one is not refused.
            self._stale = True
            raise
        self._after_change(None)

    def _assemble(self, sources: list[Source]) -> None:
        """Assemble ``sources`` afresh (they become the toolkit's), keeping the entries of the
        tools that did not change; ``_after_change`` is the caller's. Refused, or failing, the
        toolkit is left as it was: the walk fills new tables, and only a whole one replaces the
        old (what they were is kept by reference, so nothing is copied)."""
        was = (self._entries, self._aliases, self._wanted, self._contested, self._offers)
        unindexed = self._unindexed
        previous = self._entries
        self._entries, self._aliases, self._wanted, self._contested = {}, {}, {}, set()
        self._offers, self._unindexed = {}, {}
        try:
            for each in sources:
                offer = self._offers[id(each)] = _Offer()
                tools = each.tools()
                publics = [sanitize_name(tool.name) for tool in tools]
                self._note(offer, tools, publics)
                for tool, public in zip(offer.tools, publics, strict=True):
                    self._claim(each, tool, public, previous)
        except BaseException:
            self._entries, self._aliases, self._wanted, self._contested, self._offers = was
            self._unindexed = unindexed
            raise
        for name in previous.keys() - self._entries.keys():
            self._unindexed[name] = None
        unindexed.update(self._unindexed)
        self._unindexed = unindexed
        self._sources = sources
        self._stale = False

    def _change_in_place(self, source: Source) -> bool:
        """Apply a change of ``source`` at the cost of what it changed, when no other source
        has a say in it: no other tool wants a name it gained or lost (nothing to refuse or hand
        over), and the tools it kept are in the same order. False when it cannot be."""
        if (
            self._stale
            or self._sources.count(source) > 1
            or (self.on_conflict == "error" and self._contested)
        ):
            return False  # a source added twice conflicts with itself; a refusal must recur
        offer = self._offers[id(source)]
        tools = list(source.tools())
        change = _difference(offer, tools)
        if change is None:
            return False
        removed, added, start = change
        lost = [offer.publics[id(tool)] for tool in removed]
        gained = [sanitize_name(tool.name) for tool in added]
        freed = set(lost)
        if (
            any(self._wanted[name] > 1 for name in lost)
            or len(set(gained)) < len(gained)
            or any(name in self._wanted and name not in freed for name in gained)
        ):
            return False
        offer.tools = tools
        listed_left = False  # the room a listed tool leaves in the budget changes what fits
        for tool, name in zip(removed, lost, strict=True):
            del offer.publics[id(tool)]
            self._want(name, -1)
            entry = self._entries.pop(name)
            if entry.original != name:
                del self._aliases[entry.original]
            self._unindexed[name] = None
            self._over_budget.pop(name, None)
            listed_left = listed_left or not entry.tool.definition.defer_loading
        for tool, name in zip(added, gained, strict=True):
            offer.publics[id(tool)] = name
            self._want(name, 1)
            self._claim(source, tool, name)
        if added:
            self._move_back(source, start)
        last = not added or (
            source is self._sources[-1] and _same(tools[len(tools) - len(added) :], added)
        )
        self._after_change(
            [self._entries[name] for name in gained] if last and not listed_left else None
        )
        return True

    def _move_back(self, source: Source, start: int) -> None:
        """Put the entries in assembly order again after ``source`` gained tools, the first of
        them its tool ``start`` (their entries went to the end): the entries of its tools from
        there on, then those of each later source, move to the end in turn."""
        entries = self._entries
        index = self._sources.index(source)
        earlier = {id(each) for each in self._sources[:index]}  # their entries stay in place
        moved: set[str] = set()  # a tool listed twice, or a source added twice, moves once
        for each in self._sources[index:]:
            if id(each) in earlier:
                continue
            offer = self._offers[id(each)]
            for tool in offer.tools[start if each is source else 0 :]:
                name = offer.publics[id(tool)]
                entry = entries.get(name)
                if (
                    name not in moved
                    and entry is not None
                    and entry.given is tool
                    and entry.source is each
                ):
                    moved.add(name)
                    entries[name] = entries.pop(name)

    # -- lookup ----------------------------------------------------------------------------------

    def get(self, name: str) -> Tool | None:
        """The tool called ``name`` (its public or its original name), or None."""
        entry = self._entries.get(name)
        if entry is None:
            alias = self._aliases.get(name)
            entry = self._entries.get(alias) if alias is not None else None
        return entry.tool if entry is not None else None

    def __getitem__(self, name: str) -> Tool:
        tool = self.get(name)
        if tool is None:
            raise KeyError(name)
        return tool

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    @property
    def tools(self) -> list[Tool]:
        """Every tool, deferred ones included, in assembly order."""
        return [entry.tool for entry in self._entries.values()]

    @property
    def sources(self) -> list[Source]:
        return list(self._sources)

    def own_settings(self) -> list[str]:
        """The settings of this toolkit that govern the calls it makes, and that do not carry
        over when it is a source of another toolkit (that one governs its tools then)."""
        own = []
        if self.pipeline.hooks:
            own.append("policy hooks")
        if not self.capabilities.unrestricted:
            own.append("capabilities")
        if self.capability_policy != "locked":
            own.append("capability_policy")
        if self.state.allowed_prefixes != ("/context/",):
            own.append("state_paths")
        if self.pipeline.limits != Limits():
            own.append("limits")
        if not isinstance(self.store, MemoryStore):
            own.append("store")
        if self._search_mode != "lexical":
            own.append("search")
        if self.defer_above is not None:
            own.append("defer_above")
        return own

    @property
    def skills(self) -> list[Skill]:
        """The skills the toolkit's skill tools can load, each name once (the first tool's)."""
        by_name: dict[str, Skill] = {}
        for _tool_name, skills in self._served_skills():
            for skill in skills:
                by_name.setdefault(skill.name, skill)
        return list(by_name.values())

    def skills_prompt(self) -> str:
        """The catalogue of skills, for a system prompt (empty when there are none)."""
        from toolmesh.sources.skills import skills_catalogue

        catalogues = (skills_catalogue(skills, name) for name, skills in self._served_skills())
        return "\n\n".join(c for c in catalogues if c)

    def _served_skills(self) -> list[tuple[str, list[Skill]]]:
        """Each skill tool served, by its public name, with the skills it can load. Served is
        what counts: a skills folder behind a prefix or in a nested toolkit is served under
        another name, and one whose tool lost its name to an earlier tool is not served."""
        from toolmesh.sources.skills import skills_served_by

        served = []
        for name, entry in self._entries.items():
            skills = skills_served_by(entry.tool)
            if skills is not None:
                served.append((name, skills))
        return served

    def to_openai(
        self,
        *,
        api: Literal["chat", "responses"] = "chat",
        strict: bool | None = None,
        deferred: bool = False,
        namespaces: bool = False,
    ) -> list[dict[str, Any]]:
        """The non-deferred tools as OpenAI function tools (see ``toolmesh.llm.to_openai``).

        ``deferred=True`` (Responses API): every tool, deferred ones with ``defer_loading`` and
        OpenAI's hosted ``tool_search`` (``namespaces``: one namespace per source); see
        ``toolmesh.llm.deferred``."""
        if deferred:
            from toolmesh.llm.deferred import to_openai_deferred

            return to_openai_deferred(self, api=api, namespaces=namespaces)
        from toolmesh.llm.formats import to_openai

        return to_openai([self[d.name] for d in self.definitions()], api=api, strict=strict)

    def to_anthropic(
        self, *, deferred: bool | Literal["bm25", "regex", "toolmesh"] = False
    ) -> list[dict[str, Any]]:
        """The non-deferred tools as Anthropic tools.

        ``deferred``: every tool, deferred ones with ``defer_loading`` and Anthropic's tool
        search (``True`` or ``"bm25"``, ``"regex"``), or toolmesh's own (``"toolmesh"``)."""
        if deferred:
            from toolmesh.llm.deferred import to_anthropic_deferred

            return to_anthropic_deferred(self, variant="bm25" if deferred is True else deferred)
        from toolmesh.llm.formats import to_anthropic

        return to_anthropic([self[d.name] for d in self.definitions()])

    def to_gemini(self) -> list[dict[str, Any]]:
        """The non-deferred tools as a Gemini tools entry."""
        from toolmesh.llm.formats import to_gemini

        return to_gemini([self[d.name] for d in self.definitions()])

    def source_of(self, name: str) -> Source | None:
        entry = self._entries.get(name) or self._entries.get(self._aliases.get(name, ""))
        return entry.source if entry is not None else None

    def _held(self, capabilities: CapabilitySet | str | Sequence[str] | None) -> CapabilitySet:
        """The capabilities a listing or search is for: None is the toolkit's own; tags (a
        list, or a lone one) are held as given, none at all holding nothing."""
        if capabilities is None:
            return self.capabilities
        if isinstance(capabilities, CapabilitySet):
            return capabilities
        return CapabilitySet(capabilities)

    def definitions(
        self,
        *,
        capabilities: CapabilitySet | str | Sequence[str] | None = None,
        kind: str = "",
        tags: Sequence[str] = (),
        include_deferred: bool = False,
    ) -> list[ToolDefinition]:
        """The listing a session sees: tools it may call, filtered by kind and tags (AND)."""
        held = self._held(capabilities)
        tags = string_list(tags, where="tags")
        key = (self._version, held, kind, tuple(tags), include_deferred)
        listing = self._listings.get(key)
        if listing is None:
            listing = [
                entry.tool.definition
                for entry in self._entries.values()
                if _visible(entry.tool.definition, held, kind, tags, include_deferred)
            ]
            if len(self._listings) > 256:
                self._listings.clear()
            self._listings[key] = listing
        return listing

    @property
    def _index(self) -> SearchIndex:
        if self._index_made is None:
            self._index_made = _create_index(self._search_mode)
        return self._index_made

    def _catch_up_index(self) -> None:
        """Apply the tool changes the search index has not seen yet."""
        pending, self._unindexed = self._unindexed, {}
        index = self._index
        for name, definition in pending.items():
            if definition is None:
                index.remove(name)
            else:
                index.add(name, definition)

    def search(
        self,
        query: str,
        *,
        capabilities: CapabilitySet | str | Sequence[str] | None = None,
        kind: str = "",
        tags: Sequence[str] = (),
        include_deferred: bool = True,
        limit: int | None = None,
    ) -> list[Tool]:
        """Tools ranked by relevance to ``query`` that the holder of ``capabilities`` may call.
        ``limit`` is a whole number (2.0, which JSON Schema calls an integer, is 2)."""
        limit = _whole_limit(limit)
        if limit is not None and limit <= 0:
            return []  # whoever ranks them: `tools[:-1]` would be nearly all
        held = self._held(capabilities)
        tags = string_list(tags, where="tags")

        def accept(name: str) -> bool:
            entry = self._entries.get(name)  # a source's own search may have changed its tools
            return (
                entry is not None
                and _searchable(entry.tool)
                and _visible(entry.tool.definition, held, kind, tags, include_deferred)
            )

        self._catch_up_index()
        # Each source is asked once; one whose own search fails is ranked by the index.
        custom: list[tuple[Source, list[str]]] = []
        for source in self._sources:
            try:
                found_names = source.search(query, tags)
                names = None if found_names is None else list(found_names)
            except Exception as exc:
                logger.warning(
                    "source %s: search failed (%s: %s); using the toolkit's ranking",
                    getattr(source, "name", source),
                    type(exc).__name__,
                    exc,
                )
                continue
            if names is not None:
                custom.append((source, names))
        if not custom:
            found = self._index.search(query, limit=limit, accept=accept)
            return [self._entries[name].tool for name, _score in found]
        custom_ids = {id(source) for source, _names in custom}
        ranked = [
            name
            for name, _score in self._index.search(query, accept=accept)
            if name in self._entries and id(self._entries[name].source) not in custom_ids
        ]
        for source, names in custom:
            publics = (self._public_name(name, source) for name in names)
            ranked = _interleave(ranked, [n for n in publics if n is not None and accept(n)])
        tools = [self._entries[name].tool for name in ranked]
        return tools[:limit] if limit is not None else tools

    def _public_name(self, name: object, source: Source) -> str | None:
        """The public name of the tool ``source`` calls ``name`` (a source ranks its tools by
        the names it gave them: ``fs.read`` is listed as ``fs_read``), or None when it names
        none of its own tools here (one it lost to an earlier source, or none at all)."""
        if not isinstance(name, str):
            return None
        for public in (name, self._aliases.get(name)):
            entry = self._entries.get(public) if public is not None else None
            if entry is not None and entry.source is source:
                return public
        return None

    def deferred_names(self) -> set[str]:
        """Names of the tools kept out of the default listing: those with ``defer_loading``,
        their source's or the ``defer_above`` token budget's doing."""
        return {n for n, e in self._entries.items() if e.tool.definition.defer_loading}

    def _defer_over_budget(self, appended: list[_Entry] | None = None) -> None:
        """Keep the default listing within ``defer_above`` tokens (estimated as in
        toolmesh.llm.deferred.estimate_tokens): the least important tools get ``defer_loading``
        in their definition, so every listing, search and provider format treats them alike.
        ``appended``: entries added after all the others by a change that changed nothing else;
        the tools before them keep their places, so only these are weighed."""
        budget = self.defer_above
        if budget is None:
            self._budget_basis = None  # weighed afresh once there is a budget again
            for name, (given, deferred) in self._over_budget.items():  # no budget: none over
                held = self._entries.get(name)
                if held is not None and held.tool is deferred:
                    held.tool = given
            self._over_budget = {}
            return
        from toolmesh.llm.deferred import estimate_tokens
        from toolmesh.sources.tool_search import SEARCH_TOOL_NAMES

        def pinned(entry: _Entry) -> bool:
            name = entry.tool.name
            return name in SEARCH_TOOL_NAMES or any(
                fnmatch.fnmatchcase(name, pattern) for pattern in self.keep_active
            )

        previous = self._over_budget

        def weigh(entry: _Entry, cost: int, keep: bool) -> None:
            if keep or self._budget_used + cost <= budget:
                self._budget_used += cost
                return
            given = entry.tool
            known = previous.get(given.name)  # the same deferred copy while its tool is the same
            entry.tool = (
                known[1]
                if known is not None and known[0] is given
                else given.replace(defer_loading=True)
            )
            self._over_budget[given.name] = (given, entry.tool)

        basis = (budget, self.keep_active)
        if appended is not None and basis == self._budget_basis and not any(map(pinned, appended)):
            # Pinned tools are weighed first, then the others in order: these come last.
            for entry in appended:
                if not entry.tool.definition.defer_loading:
                    cost = estimate_tokens(entry.tool)
                    self._token_costs[id(entry.tool)] = (entry.tool, cost)
                    weigh(entry, cost, False)
            return
        self._budget_basis = basis
        self._over_budget = {}
        for name, (given, deferred) in previous.items():  # decide afresh
            held = self._entries.get(name)
            if held is not None and held.tool is deferred:
                held.tool = given
        active = [e for e in self._entries.values() if not e.tool.definition.defer_loading]
        costs: dict[int, tuple[Tool, int]] = {}
        for entry in active:
            known = self._token_costs.get(id(entry.tool))
            if known is None or known[0] is not entry.tool:
                known = (entry.tool, estimate_tokens(entry.tool))
            costs[id(entry.tool)] = known
        self._token_costs = costs
        self._budget_used = sum(cost for _, cost in costs.values())
        if self._budget_used <= budget:
            return
        self._budget_used = 0
        pins = [pinned(entry) for entry in active]
        for keep in (True, False):  # pinned tools first, then the others, in assembly order
            for entry, pin in zip(active, pins, strict=True):
                if pin is keep:
                    weigh(entry, costs[id(entry.tool)][1], keep)

    # -- calling ---------------------------------------------------------------------------------

    async def execute(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        on_event: Callable[[ToolEvent], None] | None = None,
        correlation_id: str = "",
        session: Session | None = None,
        on_approval: Approver | None = None,
    ) -> ToolResult:
        """Call a tool through the pipeline; tool failures come back as results.

        ``on_approval`` answers approval requests of this call (without it, a tool that needs
        approval is denied). A closed toolkit raises ``ProtocolError`` (``shutting_down``), as
        a closed host does: its sources and store are gone."""
        if self._closed:
            raise ProtocolError(ErrorCode.SHUTTING_DOWN, f"the toolkit {self.name!r} is closed")
        spec = CallSpec(
            tool_name=name,
            arguments=dict(arguments or {}),
            req_id=new_id(),
            correlation_id=correlation_id,
            streaming=on_event is not None,
            timeout=timeout,
        )
        caller = session or self.session
        if on_approval is not None:
            approver = on_approval if on_event is None else _telling(on_event, on_approval)
            caller = dataclasses.replace(caller, approver=approver)
        key = id(spec)
        self._calls[key] = spec  # close() ends it (a shell command's processes with it)
        try:
            return await self.pipeline.call(caller, spec, on_event)
        finally:
            del self._calls[key]
            if self._calls_done is not None and not self._calls:
                self._calls_done.set()

    # -- remote agents and serving ---------------------------------------------------------------

    async def add_agent(self, agent_or_url: Any) -> Source:
        """Add a remote A2A agent (``agent(...)`` or its card URL): one tool per skill of its
        card, after everything already here. A failing agent leaves its source ``failed``."""
        from toolmesh.a2a import AgentSource, agent

        if isinstance(agent_or_url, AgentSource):
            source = agent_or_url
        else:
            source = AgentSource(
                agent(agent_or_url) if isinstance(agent_or_url, str) else agent_or_url
            )
        self.add(source)
        await source.open()
        return source

    async def serve(
        self,
        bind: str = "127.0.0.1:0",
        *,
        client: Any = None,
        a2a: Mapping[str, Any] | str | bool | None = None,
        mcp: Any = None,
        auth_token: str | None = None,
        allowed_origins: Sequence[str] = (),
        max_parallel: int = 8,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> ServeHandle:
        """Serve this toolkit over HTTP on ``bind`` (``HOST:PORT``; port 0 picks one): A2E
        always, an A2A agent with ``a2a={"name": ..., "description": ...}`` (its tasks run
        ``client``'s agent loop), MCP with ``mcp=``. ``max_parallel`` and
        ``max_message_bytes`` are the A2E and MCP sessions' limits, as ``Host``'s. Returns a
        handle with ``url`` and ``stop()``."""
        from toolmesh.serving import serve_toolkit

        return await serve_toolkit(
            self,
            bind,
            client=client,
            a2a=a2a,
            mcp=mcp,
            auth_token=auth_token,
            allowed_origins=string_list(allowed_origins, where="allowed_origins"),
            max_parallel=max_parallel,
            max_message_bytes=max_message_bytes,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> Toolkit:
        """Open the store and every source (connections, processes), all at once: one slow
        server does not hold up the others. Once: starting a started toolkit (``async with``
        on what ``create_toolkit`` returned) opens nothing again, so no second process or
        connection is left behind for ``close`` to miss."""
        async with self._start_lock:  # a second caller meanwhile waits for the first
            if self._started:
                return self
            await self.store.open()  # a store that cannot open raises; a later start retries
            self._started = True
            try:
                outcomes = await asyncio.gather(
                    *(source.open() for source in self._sources), return_exceptions=True
                )
                failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
                if failure is not None:
                    raise failure
            except BaseException:
                # Cancelled, or a source's open raised: what did open is closed again (the
                # caller of create_toolkit has no toolkit to close); a later start opens the
                # sources that can be opened again.
                self._started = False
                await self._close_sources()
                raise
        return self

    async def close(self) -> None:
        """End the calls still running (each answers ``cancelled`` and is audited), then close
        every source and the store; no child process is left behind."""
        if self._closed:
            return
        self._closed = True
        await self._end_calls()
        await self._close_sources()
        await self.pipeline.drain()
        await self.store.close()

    async def _end_calls(self, timeout: float = 5.0) -> None:
        if not self._calls:
            return
        for spec in list(self._calls.values()):
            self.pipeline.abort(spec, "the call was cancelled: the toolkit is closing")
        if self._calls_done is None or self._calls_done.is_set():
            self._calls_done = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):  # they answer, and are audited, first
                await self._calls_done.wait()

    async def _close_sources(self) -> None:
        for source in reversed(self._sources):
            try:
                await source.close()
            except Exception:
                logger.exception("closing source %r failed", source.name)

    async def __aenter__(self) -> Toolkit:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"Toolkit({self.name!r}, tools={len(self._entries)})"


class ToolkitSource(Source):
    """Another toolkit's tools as a source (its pipeline is bypassed: the outer one governs)."""

    def __init__(self, toolkit: Toolkit) -> None:
        self.toolkit = toolkit
        self.name = f"toolkit:{toolkit.name}"
        toolkit._watchers.append(self.changed)  # its sources change: so do its tools

    def tools(self) -> Sequence[Tool]:
        return self.toolkit.tools

    def unwatch(self) -> None:
        with contextlib.suppress(ValueError):
            self.toolkit._watchers.remove(self.changed)

    async def close(self) -> None:
        self.unwatch()
        await self.toolkit.close()


def _telling(on_event: Callable[[ToolEvent], None], approver: Approver) -> Approver:
    """``approver``, after handing the call's approval event to ``on_event``: the event every
    transport delivers first (seq 0), which a call made here would otherwise never show."""

    async def approve(request: ApprovalRequest) -> Any:
        on_event(request.event)
        return await ask(approver, request)

    return approve


def _same(tools: Sequence[Tool], others: Sequence[Tool]) -> bool:
    return len(tools) == len(others) and all(map(operator.is_, tools, others))


def _difference(offer: _Offer, tools: list[Tool]) -> tuple[list[Tool], list[Tool], int] | None:
    """The tools ``offer`` lost and gained to become ``tools``, and where in ``tools`` the
    first gained one is, when the tools kept are in the same order (else which of two tools of
    one name comes first may have changed); None otherwise, or when ``offer`` lists a tool twice
    (a tool ``tools`` lists twice is gained twice, or with a name already wanted). Only the
    stretch between the unchanged beginning and end is read one by one."""
    before = offer.tools
    if len(offer.publics) < len(before):
        return None
    shorter = min(len(before), len(tools))
    head = _same_run(before, tools, shorter)
    tail = _same_run(reversed(before), reversed(tools), shorter - head)
    was, now = before[head : len(before) - tail], tools[head : len(tools) - tail]
    was_ids, now_ids = {id(tool) for tool in was}, {id(tool) for tool in now}
    kept = [tool for tool in now if id(tool) in was_ids]
    if not _same(kept, [tool for tool in was if id(tool) in now_ids]):
        return None
    lost = [tool for tool in was if id(tool) not in now_ids]
    gained = [tool for tool in now if id(tool) not in was_ids]
    return lost, gained, (head + now.index(gained[0]) if gained else len(tools))


def _same_run(first: Iterable[Tool], second: Iterable[Tool], most: int) -> int:
    """For how many tools (``most`` at most) the two go on with the same objects; counted at C
    speed, as a change to a long list is usually a short stretch of it."""
    differs = map(operator.is_not, itertools.islice(first, most), second)
    return next(itertools.compress(itertools.count(), differs), most)


def _searchable(tool: Tool) -> bool:
    """Whether a search may find ``tool``: not a tool-search tool (``ToolSearchSource``'s, of
    this toolkit or a nested one, under any name), listed but never a hit: the examples in
    their descriptions ("create a GitHub issue", "^slack_") matched searches for tools that
    are not there."""
    return tool.source != "tool_search"


def _whole_limit(limit: object) -> int | None:
    """A search limit as an int: a whole float (a wire caller's 2.0, valid for JSON Schema's
    "integer") is that int; anything else but None is a ConfigError, not a TypeError from
    deep in the ranking."""
    if limit is None or (isinstance(limit, int) and not isinstance(limit, bool)):
        return limit
    if isinstance(limit, float) and limit.is_integer():
        return int(limit)
    raise ConfigError(f"limit must be a whole number or None, not {limit!r}")


def _flattened(items: Sequence[Any]) -> list[Any]:
    """The sources given, a list that holds live sources (an OpenAPI document to fetch, an MCP
    server, a toolkit) taken apart so that each is opened, closed and watched as itself; a list
    of plain tools and functions stays one source."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, list | tuple) and any(_live(x) for x in item):
            out.extend(_flattened(item))
        else:
            out.append(item)
    return out


def _live(item: Any) -> bool:
    if isinstance(item, list | tuple):
        return any(_live(x) for x in item)
    plugin_class = isinstance(item, type) and issubclass(item, ToolPlugin)
    live_source = isinstance(item, Source) and not isinstance(item, ToolSet)
    return live_source or plugin_class or isinstance(item, ToolPlugin | Toolkit)


def as_source(item: Any) -> Source:
    """Whatever a user passes as a source, as a Source."""
    if isinstance(item, Source):
        return item
    if isinstance(item, ToolPlugin):
        return PluginSource(item)
    if isinstance(item, type) and issubclass(item, ToolPlugin):
        return PluginSource(item())
    if isinstance(item, Toolkit):
        return ToolkitSource(item)
    if isinstance(item, Tool):
        return ToolSet([item], name=f"tool:{item.name}")
    if isinstance(item, list | tuple):
        sources = [as_source(x) for x in item]
        tools = [t for s in sources for t in s.tools()]
        return ToolSet(tools, name="tools")
    if callable(item):
        made = function_tool(item)
        return ToolSet([made], name=f"function:{made.name}")
    if inspect.iscoroutine(item):  # an async factory called without await
        name = getattr(item, "__qualname__", "a coroutine function")
        item.close()  # now, so that no "never awaited" warning follows later
        raise ConfigError(
            f"cannot serve a coroutine: await {name}(...) first (its result is the source)"
        )
    raise ConfigError(
        f"cannot serve {item!r}: expected a ToolPlugin, Toolkit, Source, Tool, @tool function "
        "or a list of these"
    )


def _visible(
    definition: ToolDefinition,
    held: CapabilitySet,
    kind: str,
    tags: Sequence[str],
    include_deferred: bool,
) -> bool:
    if definition.defer_loading and not include_deferred:
        return False
    if kind and definition.kind != kind:
        return False
    if tags and not all(tag in definition.tags for tag in tags):
        return False
    return held.allows(definition.capabilities)


def _interleave(first: list[str], second: list[str]) -> list[str]:
    out: list[str] = []
    for pair in zip(first, second, strict=False):
        out.extend(pair)
    longer = first if len(first) > len(second) else second
    out.extend(longer[min(len(first), len(second)) :])
    return list(dict.fromkeys(out))


async def create_toolkit(
    *,
    tools: Sequence[SourceLike] = (),
    builtins: bool | Mapping[str, Any] = False,
    skills_dir: str | Path | None = None,
    mcp: Any = None,
    agents: Sequence[Any] | Mapping[str, Any] = (),
    config: str | Path | None = None,
    workspace: str | Path | None = None,
    name: str | None = None,
    on_conflict: OnConflict | None = None,
    capabilities: Sequence[str] | None = None,
    capability_policy: CapabilityPolicy | None = None,
    audit: Store | str | Path | None = None,
    limits: Limits | None = None,
) -> Toolkit:
    """Assemble a toolkit from its sources and open them (seed 002's entry point).

    Sources are added in this order, which decides who keeps a contested name: the manifest
    (``config``), ``tools``, ``builtins``, ``skills_dir``, ``mcp`` servers, ``agents``. A
    setting given here wins over the manifest's (None: the manifest's, else the default:
    "toolmesh", "warn", every capability, "locked").
    """
    if config is not None:  # the toolmesh.toml manifest: its settings unless given here
        from toolmesh.manifest import load_manifest

        toolkit = load_manifest(config).toolkit(
            name=name,
            on_conflict=on_conflict,
            capabilities=capabilities,
            capability_policy=capability_policy,
            audit=audit,
            limits=limits,
        )
    else:
        toolkit = Toolkit(
            name=name or "toolmesh",
            on_conflict=on_conflict or "warn",
            capabilities=capabilities,
            capability_policy=capability_policy or "locked",
            store=audit,
            limits=limits,
        )

    try:
        for item in tools:
            toolkit.add(item)

        if builtins:  # files, shell, HTTP, code: confined to `workspace` (default ./workspace)
            from toolmesh.sources.builtins import builtin_source

            toolkit.add(builtin_source(builtins, workspace=workspace))

        if skills_dir is not None:
            from toolmesh.sources.skills import SkillsSource

            toolkit.add(SkillsSource(skills_dir))

        if mcp:  # MCP servers (toolmesh.toml or the mcpServers JSON shape)
            from toolmesh.mcp.config import mcp_configs
            from toolmesh.mcp.source import mcp_source

            for server in mcp_configs(mcp):
                toolkit.add(mcp_source(server))

        if agents:  # remote A2A agents: Agent, card URL, or an `agents` config table
            from toolmesh.a2a import AgentSource, parse_agents_config
            from toolmesh.a2a.remote import Agent, agent

            listed: list[Any] = (
                parse_agents_config(agents) if isinstance(agents, Mapping) else list(agents)
            )
            for entry in listed:
                if not isinstance(entry, Agent | str):
                    raise ConfigError(f"agents= takes agent(...) or card URLs, not {entry!r}")
                toolkit.add(AgentSource(agent(entry) if isinstance(entry, str) else entry))

        if workspace is not None and not builtins:
            raise ConfigError(
                "create_toolkit(workspace=...) confines the built-in tools; enable builtins"
            )
    except BaseException:  # refused (a name clash), or a source not made: as Toolkit(...)
        toolkit._let_go(tools)
        raise

    try:
        return await toolkit.start()
    except BaseException:
        await toolkit.close()  # its store too: the caller has no toolkit to close
        raise


def _create_index(mode: SearchMode | SearchIndex) -> SearchIndex:
    from toolmesh.search import create_index

    return create_index(mode)
