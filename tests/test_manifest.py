"""The toolmesh.toml manifest: loading every kind issue 3 owns, dispatch to the others, and an
error naming its place for every mistake."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tests.fixtures import manifest_kinds
from tests.fixtures.failing_plugins import SOURCE as FAILING_PLUGINS
from toolmesh import ConfigError, NameConflictError, create_toolkit
from toolmesh import manifest as manifest_module
from toolmesh.manifest import load_manifest

PETSTORE = Path(__file__).parent / "fixtures" / "openapi" / "petstore3.yaml"

MYTOOLS = '''
from toolmesh import tool


@tool
def greet(name: str) -> str:
    """Greet someone."""
    return f"hello {name}"


@tool
def shout(text: str) -> str:
    """Shout."""
    return text.upper()


@tool
def secret_thing() -> str:
    """Not for everyone."""
    return "s"


TOOLS = [greet, shout, secret_thing]
'''


def write(folder: Path, text: str, name: str = "toolmesh.toml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "mytools_manifest.py").write_text(MYTOOLS)
    (tmp_path / "api.yaml").write_text(PETSTORE.read_text())
    return tmp_path


async def test_a_manifest_declares_a_whole_toolkit(project: Path) -> None:
    path = write(
        project,
        """
        [toolkit]
        name = "desk"
        capabilities = ["text", "pets::read"]
        capability_policy = "extensible"
        audit = "audit.db"

        [[tools]]
        kind = "python"
        module = "mytools_manifest:TOOLS"
        deny = ["secret_*"]
        capabilities = ["text::write"]

        [[tools]]
        kind = "http"
        name = "lookup"
        url = "http://127.0.0.1:9/items/{id}"
        [tools.config]
        timeout = 5
        result = "json"

        [[tools]]
        kind = "openapi"
        spec = "api.yaml"
        prefix = "pets"
        allow = ["getPetById", "findPets*"]
        capabilities = ["pets::read"]
        base_url = "http://127.0.0.1:9/api/v3"

        [[tools]]
        kind = "mcp"
        enabled = false
        command = "never-started"
        """,
    )
    kit = await create_toolkit(config=path)
    try:
        assert kit.name == "desk" and kit.capability_policy == "extensible"
        assert kit.names() == [
            "greet",
            "shout",
            "lookup",
            "pets_findPetsByStatus",
            "pets_findPetsByTags",
            "pets_getPetById",
        ]
        assert kit["greet"].capabilities == ["text::write"]
        assert kit["pets_getPetById"].capabilities == ["pets::read"]
        assert kit["lookup"].input_schema["required"] == ["id"]
        result = await kit.execute("greet", {"name": "Ada"})
        assert result.output == "hello Ada"
    finally:
        await kit.close()
    assert (project / "audit.db").exists()


async def test_create_toolkit_arguments_win_over_the_manifest(project: Path) -> None:
    path = write(
        project,
        """
        [toolkit]
        name = "from-file"
        on_conflict = "error"

        [[tools]]
        kind = "python"
        module = "mytools_manifest:greet"
        """,
    )
    kit = await create_toolkit(config=path, name="given", tools=[])
    assert kit.name == "given" and kit.on_conflict == "error"
    await kit.close()
    duplicate = write(
        project,
        """
        [toolkit]
        on_conflict = "error"
        [[tools]]
        kind = "python"
        module = "mytools_manifest:greet"
        [[tools]]
        kind = "python"
        module = "mytools_manifest:TOOLS"
        """,
        "dup.toml",
    )
    with pytest.raises(NameConflictError, match="'greet'"):
        await create_toolkit(config=duplicate)


def test_other_kinds_get_one_flat_entry_and_the_manifest_folder(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(manifest_module.KIND_MODULES, "javascript", "tests.fixtures.manifest_kinds")
    monkeypatch.setitem(manifest_module.KIND_MODULES, "mcp", "tests.fixtures.manifest_kinds")
    monkeypatch.setitem(manifest_module.KIND_MODULES, "a2a", "tests.fixtures.manifest_kinds")
    monkeypatch.setattr(manifest_module, "BUILTINS_MODULE", "tests.fixtures.manifest_kinds")
    manifest_kinds.SEEN.clear()
    path = write(
        project,
        """
        [builtins]
        workspace = "./work"
        files = true
        tool = "builtin_tool"

        [[tools]]
        kind = "javascript"
        package = "./js"
        prefix = "js"
        capabilities = ["js"]
        config = { memory_mb = 64 }

        [mcpServers.github]
        command = "npx"
        args = ["-y", "server-github"]

        [agents.desk]
        url = "http://127.0.0.1:1/card.json"
        """,
    )
    manifest = load_manifest(path)
    entries = [entry for entry, _ in manifest_kinds.SEEN]
    assert entries == [
        {"kind": "javascript", "package": "./js", "memory_mb": 64},
        {"workspace": "./work", "files": True, "tool": "builtin_tool"},
        {"kind": "mcp", "servers": {"github": {"command": "npx", "args": ["-y", "server-github"]}}},
        {"kind": "a2a", "agents": {"desk": {"url": "http://127.0.0.1:1/card.json"}}},
    ]
    assert {base for _, base in manifest_kinds.SEEN} == {project.resolve()}
    kit = manifest.toolkit()
    assert kit.names() == ["js_javascript_tool", "builtin_tool", "mcp_tool", "a2a_tool"]
    assert kit["js_javascript_tool"].capabilities == ["js"]


BAD = [
    ("[toolkit\nname = 1", r"toolmesh\.toml: line 1, column 9: not valid TOML"),
    ("[plugins]\nx = 1", r"toolmesh\.toml: unknown table\(s\) plugins"),
    ("[toolkit]\ncolour = 1", r"toolmesh\.toml: toolkit: unknown key\(s\) colour"),
    (
        "[toolkit]\ncapability_policy = 'open'",
        r"toolkit\.capability_policy: must be 'locked' or 'extensible'",
    ),
    (
        "[toolkit]\ncapabilities = ['bad tag']",
        r"toolkit\.capabilities: capability 'bad tag' is not",
    ),
    ("[toolkit]\nskills_dir = 'nowhere'", r"toolkit\.skills_dir: .*nowhere is not a folder"),
    ("tools = 3", r"toolmesh\.toml: tools: write each tool as a \[\[tools\]\] table"),
    ("[[tools]]\nname = 'x'", r"toolmesh\.toml: tools\[0\]: needs kind"),
    ("[[tools]]\nkind = 'ruby'", r'tools\[0\] \(kind "ruby"\): unknown kind'),
    (
        "[[tools]]\nkind = 'http'\nenabled = 'yes'",
        r'tools\[0\] \(kind "http"\): enabled must be true or false',
    ),
    ("[[tools]]\nkind = 'http'\nprefix = 'a.b'", r"prefix must be letters"),
    ("[[tools]]\nkind = 'http'\nallow = 'x*'", r"allow must be a list"),
    (
        "[[tools]]\nkind = 'http'\nurl = 'http://h'\nconfig = { url = 'http://i' }",
        r"url given both beside kind and in config",
    ),
    (
        "[[tools]]\nkind = 'http'\nname = 'x'\nurl = 'http://h'\ncolour = 1",
        r'tools\[0\] \(kind "http"\): unknown key\(s\) colour',
    ),
    (
        "[[tools]]\nkind = 'openapi'\nspec = 'missing.yaml'",
        r'tools\[0\] \(kind "openapi"\): .*missing\.yaml: cannot read the document',
    ),
    (
        "[[tools]]\nkind = 'python'",
        r'tools\[0\] \(kind "python"\): kind python needs either module',
    ),
    (
        "[[tools]]\nkind = 'python'\nmodule = 'no_such_module_here:x'",
        r"cannot import 'no_such_module_here'",
    ),
    (
        "[[tools]]\nkind = 'python'\nmodule = 'mytools_manifest:nothing'",
        r"'mytools_manifest' has no attribute 'nothing'",
    ),
    ("[[tools]]\nkind = 'python'\nmodule = 'mytools_manifest'", r'module must be "pkg\.mod:attr"'),
    (
        "[[tools]]\nkind = 'python'\nmodule = 'mytools_manifest:TOOLS'\ncapabilities = ['a b']",
        r"capabilities: capability 'a b'",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_every_error_names_its_place(project: Path, text: str, message: str) -> None:
    path = write(project, text)
    with pytest.raises(ConfigError, match=message):
        load_manifest(path)


def test_missing_kind_modules_and_failing_kinds_are_located(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(manifest_module.KIND_MODULES, "mcp", "toolmesh.not_built_yet.config")
    monkeypatch.setitem(manifest_module.KIND_MODULES, "a2a", "tests.fixtures.manifest_kinds")
    path = write(
        project,
        "[[tools]]\nkind = 'http'\nname = 'ok'\nurl = 'http://h'\n[[tools]]\nkind = 'mcp'\n",
    )
    with pytest.raises(
        ConfigError,
        match=r'^.*toolmesh\.toml: tools\[1\] \(kind "mcp"\): kind "mcp" is not available in this build '
        r"\(toolmesh\.not_built_yet\.config is missing\)$",
    ):
        load_manifest(path)
    path = write(project, "[mcpServers.x]\ncommand = 'y'\n")
    with pytest.raises(
        ConfigError, match=r"toolmesh\.toml: mcpServers: kind \"mcp\" is not available"
    ):
        load_manifest(path)
    path = write(project, "[[tools]]\nkind = 'a2a'\nfail = 'config'\n")
    with pytest.raises(
        ConfigError, match=r'tools\[0\] \(kind "a2a"\): servers\.github: command is missing$'
    ):
        load_manifest(path)
    path = write(project, "[[tools]]\nkind = 'a2a'\nfail = 'crash'\n")
    with pytest.raises(
        ConfigError, match=r'tools\[0\] \(kind "a2a"\): ValueError: an unexpected value$'
    ):
        load_manifest(path)


def test_unreadable_manifest(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read the manifest"):
        load_manifest(tmp_path / "nope.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_manifest(binary)


def test_a_settings_only_manifest(project: Path) -> None:
    path = write(project, "[toolkit]\naudit = ':memory:'\non_conflict = 'error'\n")
    manifest = load_manifest(path)
    assert (manifest.audit, manifest.on_conflict, manifest.sources) == (":memory:", "error", [])
    assert manifest.capabilities is None


async def test_policy_table_becomes_the_toolkits_rules(tmp_path: Path) -> None:
    (tmp_path / "policy_tools.py").write_text(
        "from toolmesh import tool\n\n@tool\ndef shell(command: str) -> str:\n"
        '    """Run."""\n    return command\n\nTOOLS = [shell]\n'
    )
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(
        '[[tools]]\nkind = "python"\nmodule = "policy_tools:TOOLS"\n\n'
        '[policy]\ndefault = "allow"\n\n[[policy.rules]]\nname = "no-rm"\neffect = "deny"\n'
        'tools = ["shell"]\nwhen = { argument = "command", matches = "rm -rf" }\n'
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        kit = await create_toolkit(config=manifest)
        denied = await kit.execute("shell", {"command": "rm -rf /"})
        assert denied.error_code == "tool_denied" and denied.metadata == {"rule": "no-rm"}
        assert (await kit.execute("shell", {"command": "ls"})).success
        await kit.close()
    finally:
        sys.path.remove(str(tmp_path))
    bad = tmp_path / "bad.toml"
    bad.write_text('[policy]\n[[policy.rules]]\nname = "x"\neffect = "perhaps"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: policy.rules\[0\]: .*effect"):
        await create_toolkit(config=bad)


def test_search_and_deferral_settings(tmp_path: Path) -> None:
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(
        '[toolkit]\nsearch = "lexical"\ntool_search = true\ndefer_above = 500\nkeep_active = ["echo*"]\n'
    )
    loaded = load_manifest(manifest)
    assert (loaded.search, loaded.tool_search, loaded.defer_above, loaded.keep_active) == (
        "lexical",
        True,
        500,
        ["echo*"],
    )
    assert "tool_search" in loaded.toolkit()
    for bad, where in (
        ("search = 'fuzzy'", "toolkit.search"),
        ("defer_above = 0", "toolkit.defer_above"),
    ):
        manifest.write_text(f"[toolkit]\n{bad}\n")
        with pytest.raises(ConfigError, match=where):
            load_manifest(manifest)


def test_a_typo_in_policy_is_located_not_ignored(tmp_path: Path) -> None:
    # `defualt = "deny"` used to be ignored, leaving every call allowed.
    path = write(tmp_path, '[policy]\ndefualt = "deny"\n', name="typo.toml")
    with pytest.raises(ConfigError, match=r"typo\.toml: policy: unknown key 'defualt'"):
        load_manifest(path)
    path = write(
        tmp_path,
        '[[policy.rules]]\nname = "r"\neffect = "deny"\nwhen = { argument = "a", eq = 5 }\n',
        name="cond.toml",
    )
    with pytest.raises(
        ConfigError, match=r"cond\.toml: policy\.rules\[0\]\.when: unknown key 'eq'"
    ):
        load_manifest(path)


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("NeedsArg", r"TypeError: .*missing 1 required positional argument"),
        ("BadList", r"RuntimeError: cannot list"),
    ],
)
def test_a_plugin_that_fails_to_load_is_located(tmp_path: Path, attr: str, message: str) -> None:
    (tmp_path / "failing_plugins_manifest.py").write_text(FAILING_PLUGINS)
    path = write(
        tmp_path, f'[[tools]]\nkind = "python"\nmodule = "failing_plugins_manifest:{attr}"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_manifest(path)
    assert str(caught.value).startswith(
        f"{path}: tools[0] (kind \"python\"): cannot use 'failing_plugins_manifest:{attr}' as tools: "
    )
    assert re.search(message, str(caught.value))


def test_python_entry_name_must_be_a_string(project: Path) -> None:
    path = write(
        project, '[[tools]]\nkind = "python"\nmodule = "mytools_manifest:TOOLS"\nname = 5\n'
    )
    with pytest.raises(ConfigError, match=r"tools\[0\] .*name must be a non-empty string"):
        load_manifest(path)


def test_an_audit_file_in_a_missing_folder_is_located(tmp_path: Path) -> None:
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text('[toolkit]\naudit = "nowhere/audit.db"\n')
    with pytest.raises(ConfigError, match=r"toolmesh.toml: toolkit.audit: the folder of .*nowhere"):
        load_manifest(manifest)


def test_a_module_that_exits_at_import_is_located(tmp_path: Path) -> None:
    # sys.exit() while importing went past the loader: `toolmesh serve` ended with the
    # module's exit status and no word of why.
    (tmp_path / "exits_at_import_manifest.py").write_text("import sys\nsys.exit(3)\n")
    path = write(tmp_path, '[[tools]]\nkind = "python"\nmodule = "exits_at_import_manifest:x"\n')
    with pytest.raises(ConfigError) as caught:
        load_manifest(path)
    assert str(caught.value) == (
        f"{path}: tools[0] (kind \"python\"): importing 'exits_at_import_manifest' failed: "
        "SystemExit: 3"
    )


def test_a_manifest_may_start_with_a_bom(tmp_path: Path) -> None:
    # Windows editors save UTF-8 with a BOM; it was "line 1, column 1: invalid statement".
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_bytes(b'\xef\xbb\xbf[toolkit]\nname = "desk"\n')
    assert load_manifest(manifest).name == "desk"


@pytest.mark.parametrize(
    ("text", "places"),
    [
        (
            "[mcpServers.x]\ncommand = 'a'\n[servers.x]\ncommand = 'b'\n",
            "server 'x' of mcpServers and server 'x' of servers",
        ),
        (
            "[[tools]]\nkind = 'mcp'\nname = 'x'\ncommand = 'a'\n"
            "[[tools]]\nkind = 'mcp'\nname = 'x'\ncommand = 'b'\n",
            "server 'x' of tools[0] and server 'x' of tools[1]",
        ),
        (
            "[[tools]]\nkind = 'mcp'\nname = 'x'\ncommand = 'a'\n[mcpServers.y]\ncommand = 'b'\n"
            "prefix = 'x'\n",
            "server 'x' of tools[0] and server 'y' of mcpServers",
        ),
        (
            "[[tools]]\nkind = 'mcp'\nname = 'a'\nprefix = 'x'\ncommand = 'a'\n"
            "[mcp.servers.x]\ncommand = 'b'\n",
            "server 'a' of tools[0] and server 'x' of mcp",
        ),
    ],
)
def test_mcp_servers_of_different_tables_cannot_share_a_prefix(
    tmp_path: Path, text: str, places: str
) -> None:
    # Each table checked only its own servers: both servers started, and every tool of the
    # second was dropped as a name already taken, with only warnings.
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_manifest(path)
    assert str(caught.value) == (
        f"{path}: {places} would both name their tools x_*; give one of them another 'prefix'"
    )


def test_mcp_servers_of_different_tables_with_their_own_prefixes_load(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[[tools]]\nkind = 'mcp'\nname = 'x'\nprefix = 'y'\ncommand = 'a'\n"
        "[[tools]]\nkind = 'mcp'\nname = 'off'\nprefix = 'x'\ncommand = 'b'\nenabled = false\n"
        "[mcpServers.x]\ncommand = 'b'\n[servers.z]\ncommand = 'c'\nprefix = ''\n"
        "[mcp.servers.w]\ncommand = 'd'\nprefix = ''\n",
    )
    assert len(load_manifest(path).sources) == 4  # the disabled entry is no source
