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
import re
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

    ``argument`` is a name or a dotted path (``options.mode``). A missing argument never matches.
    """

    argument: str
    matches: str | None = None
    equals: Any = None
    one_of: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        given = [self.matches is not None, self.equals is not None, self.one_of is not None]
        if sum(given) != 1:
            raise ConfigError(
                f"condition on {self.argument!r} needs exactly one of matches, equals, one_of"
            )
        if self.matches is not None:
            try:
                re.compile(self.matches)
            except re.error as exc:
                raise ConfigError(f"condition on {self.argument!r}: bad regex: {exc}") from exc

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        found, value = _lookup(arguments, self.argument)
        if not found:
            return False
        if self.matches is not None:
            return (
                re.search(self.matches, value if isinstance(value, str) else str(value)) is not None
            )
        if self.one_of is not None:
            return value in self.one_of
        return bool(value == self.equals)


def _lookup(arguments: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = arguments
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


@dataclass(frozen=True, slots=True)
class Rule:
    """One policy rule; ``name`` is what the audit log records when it decides."""

    name: str
    effect: Effect
    tools: Sequence[str] = ("*",)
    when: Sequence[Predicate] = ()
    reason: str = ""

    def __post_init__(self) -> None:
        if self.effect not in ("allow", "deny", "approve"):
            raise ConfigError(f"rule {self.name!r}: effect must be allow, deny or approve")
        if not self.name:
            raise ConfigError("every policy rule needs a name (the audit log records it)")

    def matches(self, tool_name: str, arguments: Mapping[str, Any]) -> bool:
        if not any(fnmatch.fnmatchcase(tool_name, pattern) for pattern in self.tools):
            return False
        return all(condition(arguments) for condition in self.when)


@dataclass
class Policy:
    """Ordered rules; use it as a policy hook: ``Host(..., hooks=[policy])``."""

    rules: Sequence[Rule] = field(default_factory=list)
    default: Effect = "allow"

    def __call__(self, session: Session, tool: Tool, arguments: Mapping[str, Any]) -> Decision:
        for rule in self.rules:
            if rule.matches(tool.name, arguments):
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


def _decision(effect: Effect, rule: str, reason: str, tool: str) -> Decision:
    if effect == "deny":
        return Decision(False, reason or f"policy rule {rule!r} denies {tool!r}", rule=rule)
    return Decision(True, reason, rule=rule, needs_approval=effect == "approve")
