"""Policy rules: who may call what, decided in a stated order, each decision named in the audit.

After the capability check (a session must hold every tag a tool requires), a ``Policy`` walks
its rules in the order given; the first rule that matches decides:

- ``allow``: the call goes ahead;
- ``deny``: the call ends with ``tool_denied`` and the rule's reason;
- ``approve``: the call waits for a person (or program) to approve it first.

A rule matches a call when the tool's name matches one of its glob patterns and, if it has
``when`` conditions, every condition holds on the arguments. When no rule matches, ``default``
decides. Rules come from code or from the ``[[policy.rules]]`` tables of toolmesh.toml.
"""

from __future__ import annotations

import fnmatch
import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from toolmesh.errors import ConfigError
from toolmesh.pipeline import Decision

if TYPE_CHECKING:
    from toolmesh.session import Session
    from toolmesh.tools import Tool

__all__ = ["ArgumentCondition", "Policy", "Rule"]

Effect = Literal["allow", "deny", "approve"]
Predicate = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class ArgumentCondition:
    """A test on one argument: ``matches`` (regex search on its text), ``equals`` or ``one_of``.

    ``argument`` is a name or a dotted path (``options.mode``); a path crosses lists too
    (``files.path`` reaches the ``path`` of every item of ``files``). A missing argument never
    matches. Numbers, booleans and null are tested as their JSON text (``true``, not ``True``).
    A list or object is tested item by item (keys too): for a deny or approve rule the condition
    holds when any item holds; for an allow rule only when every item does, so that hiding one
    value among others never widens what a rule lets through.
    """

    argument: str
    matches: str | None = None
    equals: Any = None
    one_of: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.argument, str) or not all(self.argument.split(".")):
            raise ConfigError(
                f"condition on {self.argument!r}: the argument must be a name or a dotted path "
                "without empty parts"
            )
        given = [self.matches is not None, self.equals is not None, self.one_of is not None]
        if sum(given) != 1:
            raise ConfigError(
                f"condition on {self.argument!r} needs exactly one of matches, equals, one_of"
            )
        if isinstance(self.one_of, str | bytes | Mapping):  # `in` a str tests substrings
            raise ConfigError(f"condition on {self.argument!r}: one_of must be a list of values")
        if self.matches is not None:
            try:
                re.compile(self.matches)
            except (re.error, TypeError) as exc:
                raise ConfigError(f"condition on {self.argument!r}: bad regex: {exc}") from exc

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        return self.holds(arguments)

    def holds(self, arguments: Mapping[str, Any], *, every: bool = False) -> bool:
        """Whether the condition holds; ``every``: a list or object must hold in each item
        (allow rules), else in any item (deny and approve rules)."""
        found = _lookup(arguments, self.argument)
        present = [value for value in found if value is not _MISSING]
        if not present:
            return False
        if every:  # an item without the argument is one the rule cannot vouch for
            return len(present) == len(found) and all(map(self._holds_every, present))
        return any(map(self._holds_any, present))

    def _holds_any(self, value: Any) -> bool:
        if self._holds_whole(value):
            return True
        return _is_container(value) and any(map(self._holds_whole, _leaves(value)))

    def _holds_every(self, value: Any) -> bool:
        if self._holds_whole(value):
            return True
        leaves = _leaves(value) if _is_container(value) else []
        return bool(leaves) and all(map(self._holds_whole, leaves))

    def _holds_whole(self, value: Any) -> bool:
        if self.matches is not None:
            if _is_container(value):
                return False  # tested item by item
            return re.search(self.matches, _text(value)) is not None
        if self.one_of is not None:
            return any(_equal(value, option) for option in self.one_of)
        return _equal(value, self.equals)


def _text(value: Any) -> str:
    """The text a regex sees: a string as it is, a number, boolean or null as JSON writes it."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool | int | float):
        try:
            return json.dumps(value)
        except ValueError:  # not reachable for these types; kept total
            return str(value)
    return str(value)


def _equal(value: Any, expected: Any) -> bool:
    try:
        return bool(value == expected)
    except Exception:  # an in-process caller's object with a broken __eq__ decides nothing
        return False


_MISSING = object()
"""What a path reaches in a list item that lacks it."""


def _is_container(value: Any) -> bool:
    return isinstance(value, list | tuple | Mapping)


def _leaves(value: Any) -> list[Any]:
    """Every key and scalar inside a list or object, walked without recursion (an argument
    may nest deeper than Python's stack) and each container once (it may contain itself)."""
    leaves: list[Any] = []
    seen: set[int] = set()
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, Mapping):
            if id(item) in seen:
                continue
            seen.add(id(item))
            leaves.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
            pending.extend(item)
        else:
            leaves.append(item)
    return leaves


def _lookup(arguments: Mapping[str, Any], path: str) -> list[Any]:
    """The values at ``path``: one for plain nesting, one per item where it crosses a list
    (``_MISSING`` for an item without it); none when the path reaches nothing. An argument
    whose own name holds dots (``filter.env``, common in OpenAPI) is reached too: at each
    object every key the next parts spell, joined by dots, is followed."""
    parts = path.split(".")
    found: list[Any] = []
    # (value, index of the next part, whether a list was crossed on the way): walked without
    # recursion, as an argument may nest lists deeper than Python's stack.
    pending: list[tuple[Any, int, bool]] = [(arguments, 0, False)]
    crossed_lists: set[tuple[int, int]] = set()  # a list may contain itself (in-process)
    while pending:
        value, index, crossed = pending.pop()
        if index == len(parts):
            found.append(value)
        elif isinstance(value, list | tuple):
            if (id(value), index) not in crossed_lists:
                crossed_lists.add((id(value), index))
                pending.extend((item, index, True) for item in reversed(value))
        elif isinstance(value, Mapping) and (
            steps := [
                (value[key], end, crossed)
                for end in range(index + 1, len(parts) + 1)
                if (key := ".".join(parts[index:end])) in value
            ]
        ):
            pending.extend(reversed(steps))
        elif crossed:  # an absence is one item's, kept so `every` can see it
            found.append(_MISSING)
    return found


@dataclass(frozen=True, slots=True)
class Rule:
    """One policy rule; ``name`` is what the audit log records when it decides."""

    name: str
    effect: Effect
    tools: Sequence[str] = ("*",)
    when: Sequence[Predicate] = ()
    reason: str = ""
    _patterns: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.effect not in ("allow", "deny", "approve"):
            raise ConfigError(f"rule {self.name!r}: effect must be allow, deny or approve")
        if not self.name:
            raise ConfigError("every policy rule needs a name (the audit log records it)")
        # A bare string is a Sequence of one-letter patterns, and a bare condition is not a
        # sequence at all: either would quietly switch the rule off.
        tools = (self.tools,) if isinstance(self.tools, str) else tuple(self.tools)
        if not tools or not all(isinstance(pattern, str) and pattern for pattern in tools):
            raise ConfigError(f"rule {self.name!r}: tools must be non-empty name patterns")
        when = (self.when,) if callable(self.when) else tuple(self.when)
        if not all(callable(condition) for condition in when):
            raise ConfigError(f"rule {self.name!r}: when must be a list of conditions")
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "when", when)
        object.__setattr__(
            self, "_patterns", _with_public_forms(tools, lossy=self.effect != "allow")
        )

    def matches(self, tool_name: str, arguments: Mapping[str, Any]) -> bool:
        if not any(fnmatch.fnmatchcase(tool_name, pattern) for pattern in self._patterns):
            return False
        every = self.effect == "allow"  # an allow rule must hold for every item of a list
        return all(
            condition.holds(arguments, every=every)
            if isinstance(condition, ArgumentCondition)
            else condition(arguments)
            for condition in self.when
        )


def _with_public_forms(patterns: Sequence[str], *, lossy: bool = True) -> tuple[str, ...]:
    """The patterns, plus each as the toolkit's public names spell it: a tool its source calls
    ``fs.read`` is ``fs_read`` (reachable by both names), ``délete_all`` is ``delete_all``, and
    a rule naming the source's spelling must still catch it. A name with letters no ASCII
    spells ("天气") is public only with a hash suffix; a glob of such letters stands for it
    only when ``lossy`` (deny and approve rules, where catching more is the safe side: the
    ``_`` in place of each letter, or the hash, could also match other names, which an allow
    rule must not let through)."""
    from toolmesh.toolkit import sanitize_name  # the toolkit imports far more than we need

    forms = list(patterns)
    for pattern in patterns:
        if _GLOB.search(pattern):
            publics = _public_globs(pattern, lossy=lossy)
        else:
            publics = [sanitize_name(pattern)]
        forms.extend(public for public in publics if public not in forms)
    return tuple(dict.fromkeys(forms))


def _public_globs(pattern: str, *, lossy: bool) -> list[str]:
    """``pattern`` as ``sanitize_name`` spells the names it matches, its glob characters kept:
    accents dropped (NFKD, as there), every other character not legal in a name made ``_``, a
    ``_`` before a leading digit or ``-``. A name that needed letters replaced also ends in
    ``_`` and 8 hex digits (and is ``tool_`` and those when no letter or digit was left),
    which the globs then allow for: only when ``lossy``, else there is no such form."""
    out: list[str] = []
    replaced = False
    in_class = False
    for index, char in enumerate(pattern):
        if char in "*?" and not in_class:
            out.append(char)
            continue
        if char == "[" and not in_class:
            in_class = True
            out.append(char)
            continue
        if in_class and (char == "]" or (char == "!" and pattern[index - 1] == "[")):
            in_class = char != "]"
            out.append(char)
            continue
        for part in unicodedata.normalize("NFKD", char) if not char.isascii() else char:
            if unicodedata.combining(part):
                continue
            replaced = replaced or not part.isascii()
            out.append(part if _NAME_CHAR.fullmatch(part) else "_")
    public = "".join(out)
    if _NEEDS_LEAD.match(public):
        public = "_" + public  # "1pass*" names "_1password"
    if not replaced:
        return [public]
    if not lossy:
        return []
    hashed = "_" + "[0-9a-f]" * 8  # sanitize_name's hash suffix
    forms = [public if public.endswith("*") else public + hashed]
    if not any(c.isascii() and c.isalnum() for c in public):
        forms.append("tool" + hashed)  # a name of no letter or digit left: "tool" and its hash
    return forms


_GLOB = re.compile(r"[*?\[]")
_NAME_CHAR = re.compile(r"[A-Za-z0-9_\-]")
_NEEDS_LEAD = re.compile(r"[0-9\-]")


@dataclass
class Policy:
    """Ordered rules; use it as a policy hook: ``Host(..., hooks=[policy])``."""

    rules: Sequence[Rule] = field(default_factory=list)
    default: Effect = "allow"

    def __call__(self, session: Session, tool: Tool, arguments: Mapping[str, Any]) -> Decision:
        seen = _with_defaults(arguments, tool.input_schema)
        for rule in self.rules:
            try:
                matched = rule.matches(tool.name, seen)
            except Exception as exc:  # a rule that cannot be judged must not let a call by
                reason = f"policy rule {rule.name!r} could not be evaluated: {_describe(exc)}"
                return Decision(False, reason, rule=rule.name)
            if matched:
                return _decision(rule.effect, rule.name, rule.reason, tool.name)
        return _decision(self.default, "default", "", tool.name)

    @classmethod
    def from_config(cls, table: Mapping[str, Any], *, where: str = "policy") -> Policy:
        """Build from a ``[policy]`` table: ``default`` and a list of ``rules``. Unknown keys
        are errors: a misspelt key would otherwise switch a rule, or the policy, off."""
        _known(table, _POLICY_KEYS, where)
        raw_rules = table.get("rules", [])
        if not isinstance(raw_rules, list | tuple):
            raise ConfigError(
                "rules must be a list of tables ([[policy.rules]])", location=f"{where}.rules"
            )
        rules = [
            _rule_from_config(raw, f"{where}.rules[{index}]") for index, raw in enumerate(raw_rules)
        ]
        default = table.get("default", "allow")
        if default not in ("allow", "deny", "approve"):
            raise ConfigError(
                f"must be allow, deny or approve, not {default!r}", location=f"{where}.default"
            )
        return cls(rules, default)


_POLICY_KEYS = ("default", "rules")
_RULE_KEYS = ("name", "effect", "tools", "when", "reason")
_CONDITION_KEYS = ("argument", "matches", "equals", "one_of")


def _known(table: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    unknown = [key for key in table if key not in known]
    if unknown:
        keys = ", ".join(repr(key) for key in unknown)
        raise ConfigError(
            f"unknown key{'s' if len(unknown) > 1 else ''} {keys} (known: {', '.join(known)})",
            location=where,
        )


def _rule_from_config(raw: Any, where: str) -> Rule:
    if not isinstance(raw, Mapping):
        raise ConfigError("a rule must be a table", location=where)
    _known(raw, _RULE_KEYS, where)
    for key in ("name", "effect", "reason"):
        if key in raw and not isinstance(raw[key], str):
            raise ConfigError(f"must be a string, not {raw[key]!r}", location=f"{where}.{key}")
    tools = raw.get("tools", ["*"])
    if isinstance(tools, str):
        tools = [tools]
    if not isinstance(tools, list | tuple) or not all(isinstance(t, str) for t in tools):
        raise ConfigError(
            f"must be a tool name pattern or a list of them, not {tools!r}",
            location=f"{where}.tools",
        )
    if not tools:  # a rule for no tool never applies: surely not what was meant
        raise ConfigError("is empty: the rule would apply to no tool", location=f"{where}.tools")
    conditions = raw.get("when", [])
    if isinstance(conditions, Mapping):
        places = [f"{where}.when"]
        conditions = [conditions]
    elif isinstance(conditions, list | tuple):
        places = [f"{where}.when[{index}]" for index in range(len(conditions))]
    else:
        raise ConfigError(
            f"must be a condition table or a list of them, not {conditions!r}",
            location=f"{where}.when",
        )
    when = [_condition_from_config(c, place) for c, place in zip(conditions, places, strict=True)]
    try:
        return Rule(
            name=raw.get("name", ""),
            effect=raw.get("effect", ""),
            tools=list(tools),
            when=when,
            reason=raw.get("reason", ""),
        )
    except ConfigError as exc:
        raise ConfigError(str(exc), location=where) from None


def _condition_from_config(raw: Any, where: str) -> ArgumentCondition:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a condition must be a table, not {raw!r}", location=where)
    _known(raw, _CONDITION_KEYS, where)
    argument = raw.get("argument")
    if not isinstance(argument, str) or not argument:
        raise ConfigError("needs argument = the argument's name (or dotted path)", location=where)
    if "matches" in raw and not isinstance(raw["matches"], str):
        raise ConfigError(f"matches must be a regex string, not {raw['matches']!r}", location=where)
    if "one_of" in raw and not isinstance(raw["one_of"], list | tuple):
        raise ConfigError(f"one_of must be a list, not {raw['one_of']!r}", location=where)
    try:
        return ArgumentCondition(
            argument, matches=raw.get("matches"), equals=raw.get("equals"), one_of=raw.get("one_of")
        )
    except ConfigError as exc:
        raise ConfigError(str(exc), location=where) from None


def _with_defaults(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The arguments as the tool will see them: a missing argument with a default in the
    schema has that value (a rule on ``mode = "force"`` must catch a call that omits a ``mode``
    defaulting to "force"), at the top level and inside the objects given (``opts: {}`` of a
    model whose ``mode`` defaults to "force", through ``$ref``, optional objects and list
    items). A default of null stays missing: it means "not given"."""
    defaults, nested = _defaults_of(schema)
    if nested:
        filled = _filled(arguments, schema, schema, 0)
        return filled if isinstance(filled, Mapping) else arguments
    missing = {name: value for name, value in defaults.items() if name not in arguments}
    return {**arguments, **missing} if missing else arguments


_DEFAULTS: dict[int, tuple[Mapping[str, Any], dict[str, Any], bool]] = {}
_FILL_DEPTH = 64  # levels of arguments given defaults; a deeper argument is left as it is
_REF_HOPS = 16  # a $ref that leads to a $ref ...: at most this many are followed


def _defaults_of(schema: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The non-null defaults of a schema's top-level properties, and whether defaults appear
    deeper too, read once per schema (the schema is kept with them, so its id names no other)."""
    known = _DEFAULTS.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1], known[2]
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    specs = list(properties.values()) if isinstance(properties, Mapping) else []
    defaults = {
        name: spec["default"]
        for name, spec in (properties.items() if isinstance(properties, Mapping) else ())
        if isinstance(spec, Mapping) and spec.get("default") is not None
    }
    nested = _defaults_below(schema, {id(spec) for spec in specs})
    if len(_DEFAULTS) >= 4096:  # tools come and go (a source re-lists): start afresh
        _DEFAULTS.clear()
    _DEFAULTS[id(schema)] = (schema, defaults, nested)
    return defaults, nested


def _defaults_below(schema: Any, top: set[int]) -> bool:
    """Whether any part of ``schema`` but its top-level properties declares a default (a
    default's own value may be walked too: that only sends a schema down the slower path)."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, Mapping):
            if "default" in node and id(node) not in top and node is not schema:
                return True
            pending.extend(node.values())
        elif isinstance(node, list | tuple):
            pending.extend(node)
    return False


def _resolved(schema: Any, root: Mapping[str, Any]) -> Any:
    """``schema`` with its local ``$ref`` followed (to what it names), or as it is."""
    from toolmesh.schema import pointer_target  # the schema module is not needed otherwise

    for _ in range(_REF_HOPS):
        ref = schema.get("$ref") if isinstance(schema, Mapping) else None
        if not isinstance(ref, str):
            break
        target = pointer_target(root, ref)
        if not isinstance(target, Mapping):
            break
        schema = target
    return schema


def _object_schemas(schema: Any, root: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The schemas whose properties an object value follows: the schema itself, every part of
    its ``allOf``, and the one object branch of an ``anyOf``/``oneOf`` (``X | None``; with
    several object branches which one applies is not known, and none is used). Each schema is
    taken once (a ``$ref`` may lead back to where it started)."""
    found: list[Mapping[str, Any]] = []
    seen: set[int] = set()
    pending = [schema]
    while pending:
        part = _resolved(pending.pop(), root)
        if not isinstance(part, Mapping) or id(part) in seen:
            continue
        seen.add(id(part))
        found.append(part)
        every = part.get("allOf")
        if isinstance(every, list | tuple):
            pending.extend(every)
        for key in ("anyOf", "oneOf"):
            branches = part.get(key)
            if isinstance(branches, list | tuple):
                objects = [
                    branch
                    for branch in (_resolved(b, root) for b in branches)
                    if isinstance(branch, Mapping)
                    and (branch.get("type") == "object" or "properties" in branch)
                ]
                if len(objects) == 1:
                    pending.append(objects[0])
    return found


def _filled(
    value: Any,
    schema: Any,
    root: Mapping[str, Any],
    depth: int,
    memo: dict[tuple[int, int], Any] | None = None,
) -> Any:
    """``value`` with the defaults ``schema`` declares for what it leaves out (a copy where
    anything was added; ``value`` itself is never changed). Each object is filled once per
    schema (``memo``): an in-process caller's arguments may share or contain themselves."""
    if depth > _FILL_DEPTH or not isinstance(value, Mapping | list | tuple):
        return value
    memo = {} if memo is None else memo
    key = (id(value), id(schema))
    if key in memo:
        return memo[key]
    memo[key] = value  # while it is being filled: a way back to it finds it as it is
    if isinstance(value, Mapping):
        out: dict[str, Any] | None = None
        for part in _object_schemas(schema, root):
            properties = part.get("properties")
            if not isinstance(properties, Mapping):
                continue
            for name, spec in properties.items():
                current = value if out is None else out
                if name in current:
                    inner = _filled(current[name], spec, root, depth + 1, memo)
                    if inner is current[name]:
                        continue
                elif isinstance(spec, Mapping) and spec.get("default") is not None:
                    inner = _filled(spec["default"], spec, root, depth + 1, memo)
                else:
                    continue
                if out is None:
                    out = dict(value)
                out[name] = inner
        result: Any = value if out is None else out
    else:
        resolved = _resolved(schema, root)
        items = resolved.get("items") if isinstance(resolved, Mapping) else None
        result = value
        if isinstance(items, Mapping):
            filled = [_filled(item, items, root, depth + 1, memo) for item in value]
            if any(new is not old for new, old in zip(filled, value, strict=True)):
                result = filled
    memo[key] = result
    return result


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _decision(effect: Effect, rule: str, reason: str, tool: str) -> Decision:
    if effect == "deny":
        return Decision(False, reason or f"policy rule {rule!r} denies {tool!r}", rule=rule)
    return Decision(True, reason, rule=rule, needs_approval=effect == "approve")
