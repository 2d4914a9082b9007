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
        """Build from a ``[policy]`` table: ``default`` and a list of ``rules``."""
        rules = []
        for index, raw in enumerate(table.get("rules") or []):
            location = f"{where}.rules[{index}]"
            if not isinstance(raw, Mapping):
                raise ConfigError("a rule must be a table", location=location)
            try:
                rules.append(_rule_from_config(raw))
            except ConfigError as exc:
                raise ConfigError(str(exc), location=location) from None
        default = table.get("default", "allow")
        if default not in ("allow", "deny", "approve"):
            raise ConfigError("default must be allow, deny or approve", location=where)
        return cls(rules, default)


def _rule_from_config(raw: Mapping[str, Any]) -> Rule:
    tools = raw.get("tools", ["*"])
    if isinstance(tools, str):
        tools = [tools]
    conditions = raw.get("when") or []
    if isinstance(conditions, Mapping):
        conditions = [conditions]
    when = [ArgumentCondition(**dict(c)) for c in conditions]
    return Rule(
        name=str(raw.get("name", "")),
        effect=raw.get("effect", ""),
        tools=list(tools),
        when=when,
        reason=str(raw.get("reason", "")),
    )


def _decision(effect: Effect, rule: str, reason: str, tool: str) -> Decision:
    if effect == "deny":
        return Decision(False, reason or f"policy rule {rule!r} denies {tool!r}", rule=rule)
    return Decision(True, reason, rule=rule, needs_approval=effect == "approve")
