"""Policy rules: stated order, glob and argument conditions, defaults, audited decisions."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from toolmesh import ConfigError, ToolDefinition, ToolErrorCode, Toolkit, tool
from toolmesh.policy import ArgumentCondition, Policy, Rule
from toolmesh.store import MemoryStore
from toolmesh.tools import Tool


@tool
def shell(command: str) -> str:
    """Pretend shell."""
    return f"ran {command}"


@tool
def read_file(path: str) -> str:
    """Pretend reader."""
    return f"read {path}"


def kit(policy: Policy) -> tuple[Toolkit, MemoryStore]:
    store = MemoryStore()
    return Toolkit(shell, read_file, hooks=[policy], store=store), store


async def test_first_matching_rule_decides_and_is_audited() -> None:
    policy = Policy(
        [
            Rule(
                "no-rm",
                "deny",
                tools=["shell"],
                when=[ArgumentCondition("command", matches=r"\brm\s+-rf\b")],
                reason="no deleting",
            ),
            Rule("shell-ok", "allow", tools=["shell"]),
            Rule("nothing-else", "deny"),
        ]
    )
    toolkit, store = kit(policy)
    denied = await toolkit.execute("shell", {"command": "echo ok && rm -rf /"})
    assert denied.error_code == ToolErrorCode.TOOL_DENIED and denied.error == "no deleting"
    allowed = await toolkit.execute("shell", {"command": "ls"})
    assert allowed.success
    other = await toolkit.execute("read_file", {"path": "x"})
    assert other.error_code == ToolErrorCode.TOOL_DENIED
    assert "nothing-else" in (other.error or "")
    assert [e.decision for e in store.audit] == ["no-rm", "shell-ok", "nothing-else"]


async def test_order_matters() -> None:
    allow_first = Policy([Rule("a", "allow"), Rule("d", "deny")])
    deny_first = Policy([Rule("d", "deny"), Rule("a", "allow")])
    assert (await kit(allow_first)[0].execute("read_file", {"path": "x"})).success
    assert not (await kit(deny_first)[0].execute("read_file", {"path": "x"})).success


@pytest.mark.parametrize(
    ("condition", "arguments", "matches"),
    [
        (ArgumentCondition("command", matches="^sudo"), {"command": "sudo ls"}, True),
        (ArgumentCondition("command", matches="^sudo"), {"command": "ls"}, False),
        (ArgumentCondition("command", matches="x"), {}, False),
        (ArgumentCondition("opts.mode", equals="fast"), {"opts": {"mode": "fast"}}, True),
        (ArgumentCondition("opts.mode", equals="fast"), {"opts": "fast"}, False),
        (ArgumentCondition("n", one_of=[1, 2]), {"n": 2}, True),
        (ArgumentCondition("n", matches="^4"), {"n": 42}, True),
    ],
)
def test_conditions(condition: ArgumentCondition, arguments: dict[str, Any], matches: bool) -> None:
    assert condition(arguments) is matches


def test_default_effect() -> None:
    policy = Policy([], default="deny")
    verdict = policy(None, shell, {})  # type: ignore[arg-type]
    assert not verdict.allowed and verdict.rule == "default"


def test_from_config_and_its_errors() -> None:
    policy = Policy.from_config(
        {
            "default": "allow",
            "rules": [
                {
                    "name": "no-curl",
                    "effect": "deny",
                    "tools": "shell",
                    "when": {"argument": "command", "matches": "curl"},
                },
                {"name": "review-deploys", "effect": "approve", "tools": ["deploy*"]},
            ],
        }
    )
    assert [r.name for r in policy.rules] == ["no-curl", "review-deploys"]
    assert policy.rules[1].effect == "approve"
    with pytest.raises(ConfigError, match=r"policy.rules\[0\]: .*effect"):
        Policy.from_config({"rules": [{"name": "x", "effect": "maybe"}]})
    with pytest.raises(ConfigError, match=r"policy.rules\[0\]: .*needs a name"):
        Policy.from_config({"rules": [{"effect": "deny"}]})
    with pytest.raises(ConfigError, match="bad regex"):
        Policy.from_config(
            {"rules": [{"name": "r", "effect": "deny", "when": {"argument": "a", "matches": "("}}]}
        )
    with pytest.raises(ConfigError, match="exactly one of"):
        ArgumentCondition("a")


async def test_approve_rule_asks_before_running() -> None:
    asked: list[Any] = []

    async def approver(request: Any) -> bool:
        asked.append(request)
        return True

    toolkit, store = kit(
        Policy([Rule("review-shell", "approve", tools=["shell"], reason="shell needs review")])
    )
    result = await toolkit.execute("shell", {"command": "ls"}, on_approval=approver)
    assert result.success and asked[0].reason == "shell needs review"
    assert store.audit[-1].decision == "review-shell:approval:approved"
    assert result.events[0].kind == "approval" and result.events[0].seq == 0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"defualt": "deny"}, r"^policy: unknown key 'defualt' \(known: default, rules\)$"),
        (
            {"rules": [{"name": "r", "effect": "deny", "whn": {"argument": "a", "equals": 1}}]},
            r"^policy\.rules\[0\]: unknown key 'whn' \(known: name, effect, tools, when, reason\)$",
        ),
        (
            {"rules": [{"name": "r", "effect": "deny", "tool": ["slow"]}]},
            r"^policy\.rules\[0\]: unknown key 'tool' ",
        ),
        (
            {"rules": [{"name": "r", "effect": "deny", "when": [{"argument": "a", "eq": 5}]}]},
            r"^policy\.rules\[0\]\.when\[0\]: unknown key 'eq' "
            r"\(known: argument, matches, equals, one_of\)$",
        ),
    ],
)
def test_from_config_refuses_unknown_keys(table: dict[str, Any], message: str) -> None:
    # A misspelt key used to be ignored, silently turning a deny rule or default off.
    with pytest.raises(ConfigError, match=message):
        Policy.from_config(table)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"tools": 5}, r"^policy\.rules\[0\]\.tools: must be a tool name pattern"),
        ({"tools": []}, r"^policy\.rules\[0\]\.tools: is empty"),
        ({"when": "x"}, r"^policy\.rules\[0\]\.when: must be a condition table"),
        ({"when": {"foo": 1}}, r"^policy\.rules\[0\]\.when: unknown key 'foo'"),
        ({"when": [5]}, r"^policy\.rules\[0\]\.when\[0\]: a condition must be a table"),
        ({"when": {"equals": 1}}, r"^policy\.rules\[0\]\.when: needs argument"),
        ({"when": {"argument": "a", "matches": 1}}, r"\.when: matches must be a regex string"),
        ({"when": {"argument": "a", "one_of": 1}}, r"\.when: one_of must be a list"),
        ({"when": {"argument": "a"}}, r"^policy\.rules\[0\]\.when: .*exactly one of"),
        ({"name": 5}, r"^policy\.rules\[0\]\.name: must be a string"),
        ({"reason": ["x"]}, r"^policy\.rules\[0\]\.reason: must be a string"),
    ],
)
def test_from_config_refuses_malformed_values(rule: dict[str, Any], message: str) -> None:
    table = {"rules": [{"name": "r", "effect": "deny", **rule}]}
    with pytest.raises(ConfigError, match=message):
        Policy.from_config(table)


def test_from_config_refuses_malformed_tables() -> None:
    with pytest.raises(ConfigError, match=r"^policy\.rules: rules must be a list of tables"):
        Policy.from_config({"rules": {"name": "r", "effect": "deny"}})
    with pytest.raises(ConfigError, match=r"^policy\.rules\[1\]: a rule must be a table"):
        Policy.from_config({"rules": [{"name": "r", "effect": "deny"}, "x"]})
    with pytest.raises(ConfigError, match=r"^policy\.default: must be allow, deny or approve"):
        Policy.from_config({"default": "nope"})


# -- regressions: ways past a deny rule -----------------------------------------------------------


@tool
def run_all(commands: list[str]) -> str:
    """Pretend batch shell."""
    return "ran " + "; ".join(commands)


@tool
def flagged(force: bool = False, data: Any = None) -> str:
    """Pretend tool with a flag and a free-form argument."""
    return "ran"


@tool
def set_mode(mode: Literal["safe", "force"] = "force") -> str:
    """Pretend tool whose default is the dangerous choice."""
    return f"ran {mode}"


@pytest.mark.parametrize(
    ("rule", "tool_name", "arguments"),
    [
        # A list argument was tested as its Python repr: "['rm -rf /']" has no "^rm".
        (
            Rule("no-rm", "deny", when=[ArgumentCondition("commands", matches=r"^rm\s")]),
            "run_all",
            {"commands": ["ls", "rm -rf /"]},
        ),
        # ... and a tab in a list item became the two characters "\t".
        (
            Rule("no-rm", "deny", when=[ArgumentCondition("commands", matches=r"rm\s+-rf")]),
            "run_all",
            {"commands": ["rm\t-rf /"]},
        ),
        # A boolean was tested as "True", not the JSON "true" a config author writes.
        (
            Rule("no-force", "deny", when=[ArgumentCondition("force", matches="^true$")]),
            "flagged",
            {"force": True},
        ),
        # A path crossing a list reached nothing.
        (
            Rule("no-etc", "deny", when=[ArgumentCondition("data.path", matches="^/etc")]),
            "flagged",
            {"data": [{"path": "/tmp/x"}, {"path": "/etc/passwd"}]},
        ),
        # An omitted argument runs with its default, which the rule must see.
        (
            Rule("no-force", "deny", when=[ArgumentCondition("mode", equals="force")]),
            "set_mode",
            {},
        ),
    ],
)
async def test_deny_rules_see_arguments_as_the_tool_gets_them(
    rule: Rule, tool_name: str, arguments: dict[str, Any]
) -> None:
    store = MemoryStore()
    toolkit = Toolkit(run_all, flagged, set_mode, hooks=[Policy([rule])], store=store)
    result = await toolkit.execute(tool_name, arguments)
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert store.audit[-1].decision == rule.name


async def test_an_allow_rule_on_a_list_must_hold_for_every_item() -> None:
    policy = Policy(
        [
            Rule("workspace", "allow", when=[ArgumentCondition("commands", matches=r"^ls\b")]),
            Rule("rest", "deny"),
        ]
    )
    toolkit = Toolkit(run_all, hooks=[policy], store=MemoryStore())
    assert (await toolkit.execute("run_all", {"commands": ["ls /ws", "ls -l"]})).success
    mixed = await toolkit.execute("run_all", {"commands": ["ls /ws", "rm -rf /"]})
    assert mixed.error_code == ToolErrorCode.TOOL_DENIED and "rest" in (mixed.error or "")


async def test_a_rule_that_cannot_be_evaluated_denies_instead_of_raising() -> None:
    deep: Any = "secret"
    for _ in range(50_000):  # deeper than Python's stack
        deep = [deep]
    store = MemoryStore()
    policy = Policy([Rule("no-secrets", "deny", when=[ArgumentCondition("data", matches="s")])])
    toolkit = Toolkit(flagged, hooks=[policy], store=store)
    result = await toolkit.execute("flagged", {"data": deep})
    assert result.error_code == ToolErrorCode.TOOL_DENIED
    broken = Policy([Rule("odd", "deny", when=[lambda arguments: 1 / 0 > 0])])
    toolkit = Toolkit(flagged, hooks=[broken], store=store)
    result = await toolkit.execute("flagged", {})
    assert result.error_code == ToolErrorCode.TOOL_DENIED
    assert "could not be evaluated: ZeroDivisionError" in (result.error or "")
    assert store.audit[-1].decision == "odd"


@pytest.mark.parametrize("pattern", ["fs.read", "fs.*", "fs.rea?"])
@pytest.mark.parametrize("called_as", ["fs.read", "fs_read"])
async def test_a_rule_naming_a_tool_as_its_source_does_catches_it(
    pattern: str, called_as: str
) -> None:
    """A source's ``fs.read`` is listed as ``fs_read`` and callable by both names."""

    async def read(arguments: dict[str, Any], ctx: Any) -> str:
        return "read"

    fs_read = Tool(ToolDefinition(name="fs.read", description="Read a file."), read)
    policy = Policy([Rule("no-fs", "deny", tools=[pattern])])
    toolkit = Toolkit(fs_read, hooks=[policy], store=MemoryStore())
    result = await toolkit.execute(called_as, {})
    assert result.error_code == ToolErrorCode.TOOL_DENIED


def test_rules_and_conditions_refuse_shapes_that_would_switch_them_off() -> None:
    # tools="deploy" used to be the patterns "d", "e", "p", ... matching no real tool.
    assert Rule("r", "deny", tools="deploy").tools == ("deploy",)
    condition = ArgumentCondition("env", equals="prod")
    assert Rule("r", "deny", when=condition).when == (condition,)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="one_of must be a list"):
        ArgumentCondition("env", one_of="prod")  # "pr" in "prod" is a substring test
    with pytest.raises(ConfigError, match="empty parts"):
        ArgumentCondition("options..mode", equals="x")
    with pytest.raises(ConfigError, match=r"^policy\.rules\[0\]\.when: .*empty parts"):
        Policy.from_config(
            {"rules": [{"name": "r", "effect": "deny", "when": {"argument": "a.", "equals": 1}}]}
        )
    with pytest.raises(ConfigError, match=r"^policy\.rules\[0\]: .*non-empty name patterns"):
        Policy.from_config({"rules": [{"name": "r", "effect": "deny", "tools": ["shell", ""]}]})


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("délete_all", "délete_*"),  # listed as delete_all: accents dropped, as in names
        ("ünsafe", "ü*"),
        ("天气_drop", "天气_*"),  # listed as ___drop_<hash>
        ("天气预报", "天气*"),  # listed as tool_<hash>
        ("天气预报", "天气??"),
    ],
)
async def test_a_glob_spelt_as_the_source_names_a_tool_catches_its_public_name(
    name: str, pattern: str
) -> None:
    async def run(arguments: dict[str, Any], ctx: Any) -> str:
        return "ran"

    tool_ = Tool(ToolDefinition(name=name, description="A tool."), run)
    toolkit = Toolkit(tool_, hooks=[Policy([Rule("no", "deny", tools=[pattern])])])
    assert toolkit.names() != [name]  # it is listed under another name
    result = await toolkit.execute(toolkit.names()[0], {})
    assert result.error_code == ToolErrorCode.TOOL_DENIED


async def test_an_allow_glob_of_letters_ascii_cannot_spell_lets_nothing_else_through() -> None:
    """ "é*" used to become "_*" for public names, which allowed every name starting with "_"."""

    async def run(arguments: dict[str, Any], ctx: Any) -> str:
        return "ran"

    admin = Tool(ToolDefinition(name="_internal_admin", description="Admin."), run)
    policy = Policy([Rule("ok", "allow", tools=["é*", "天*"])], default="deny")
    toolkit = Toolkit(admin, hooks=[policy])
    result = await toolkit.execute("_internal_admin", {})
    assert result.error_code == ToolErrorCode.TOOL_DENIED and "default" in (result.error or "")
    assert (await Toolkit(make_named("école"), hooks=[policy]).execute("ecole", {})).success


def make_named(name: str) -> Tool:
    async def run(arguments: dict[str, Any], ctx: Any) -> str:
        return "ran"

    return Tool(ToolDefinition(name=name, description="A tool."), run)


async def test_a_condition_reaches_an_argument_whose_name_holds_dots() -> None:
    async def run(arguments: dict[str, Any], ctx: Any) -> Any:
        return arguments

    schema = {
        "type": "object",
        "properties": {
            "filter.env": {"type": "string"},
            "page": {"type": "object", "properties": {"size.max": {"type": "integer"}}},
        },
    }
    query = Tool(ToolDefinition(name="query", description="Query."), run, input_schema=schema)
    policy = Policy(
        [
            Rule("no-prod", "deny", when=[ArgumentCondition("filter.env", equals="prod")]),
            Rule("small", "deny", when=[ArgumentCondition("page.size.max", matches="^1000$")]),
        ]
    )
    toolkit = Toolkit(query, hooks=[policy])
    denied = await toolkit.execute("query", {"filter.env": "prod"})
    assert denied.error_code == ToolErrorCode.TOOL_DENIED and "no-prod" in (denied.error or "")
    denied = await toolkit.execute("query", {"page": {"size.max": 1000}})
    assert denied.error_code == ToolErrorCode.TOOL_DENIED and "small" in (denied.error or "")
    assert (await toolkit.execute("query", {"filter.env": "dev", "page": {"size.max": 5}})).success


async def test_conditions_see_defaults_inside_the_objects_given() -> None:
    """The tool gets ``mode = "force"`` for ``opts: {}``: a rule on it must see that too, through
    a ``$ref``, an optional object and the items of a list."""
    from pydantic import BaseModel

    class Opts(BaseModel):
        mode: str = "force"

    class Plan(BaseModel):
        steps: list[Opts] = []

    seen: list[str] = []

    @tool
    def deploy(opts: Opts, maybe: Opts | None = None, plan: Plan | None = None) -> str:
        """Deploy."""
        seen.append(opts.mode)
        return "deployed"

    policy = Policy(
        [
            Rule("no-force", "deny", when=[ArgumentCondition("opts.mode", equals="force")]),
            Rule("no-maybe", "deny", when=[ArgumentCondition("maybe.mode", equals="force")]),
            Rule("no-step", "deny", when=[ArgumentCondition("plan.steps.mode", equals="force")]),
        ]
    )
    toolkit = Toolkit(deploy, hooks=[policy])
    for arguments, rule in [
        ({"opts": {}}, "no-force"),
        ({"opts": {"mode": "safe"}, "maybe": {}}, "no-maybe"),
        ({"opts": {"mode": "safe"}, "plan": {"steps": [{"mode": "safe"}, {}]}}, "no-step"),
    ]:
        result = await toolkit.execute("deploy", arguments)
        assert result.error_code == ToolErrorCode.TOOL_DENIED, arguments
        assert rule in (result.error or "")
    assert seen == []
    allowed = await toolkit.execute("deploy", {"opts": {"mode": "safe"}, "plan": {"steps": []}})
    assert allowed.success and seen == ["safe"]


async def test_a_path_across_a_list_that_contains_itself_ends() -> None:
    async def run(arguments: dict[str, Any], ctx: Any) -> str:
        return "ran"

    loop: list[Any] = [{"path": "/etc/passwd"}]
    loop.append(loop)
    policy = Policy(
        [Rule("no-etc", "deny", when=[ArgumentCondition("files.path", matches="^/etc")])]
    )
    toolkit = Toolkit(make_named("copy"), hooks=[policy])
    assert policy.rules[0].matches("copy", {"files": loop})  # it ends, having seen the item
    result = await toolkit.execute("copy", {"files": loop})
    assert result.error_code in (ToolErrorCode.TOOL_DENIED, ToolErrorCode.INVALID_ARGUMENTS)


async def test_defaults_are_filled_once_in_arguments_that_share_or_contain_themselves() -> None:
    """An in-process caller's arguments may repeat one list (or hold themselves): walking
    each path afresh took time exponential in the nesting."""

    async def run(arguments: dict[str, Any], ctx: Any) -> str:
        return "ran"

    schema = {
        "type": "object",
        "properties": {"tree": {"$ref": "#/$defs/Node"}},
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "mode": {"type": "string", "default": "force"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
            }
        },
    }
    shared: dict[str, Any] = {"kids": []}
    for _ in range(60):  # 2**60 paths, 60 objects
        shared = {"mode": "safe", "kids": [shared, shared]}
    node = {"mode": "safe", "kids": [{"kids": [shared, shared]}]}  # a kid of mode "force"
    looped: dict[str, Any] = {"mode": "safe", "kids": []}
    looped["kids"].append(looped)
    tree = Tool(ToolDefinition(name="tree", description="Tree."), run, input_schema=schema)
    rule = Rule("no-force", "deny", when=[ArgumentCondition("tree.kids.mode", equals="force")])
    policy = Policy([rule])
    for value in (node, looped):
        decision = policy(None, tree, {"tree": value})  # type: ignore[arg-type]
        assert decision.allowed is (value is looped), decision
