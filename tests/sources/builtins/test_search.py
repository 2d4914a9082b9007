"""glob and grep."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sources.builtins.conftest import Make
from toolmesh.sources.builtins.globbing import compile_glob


def tree(root: Path) -> None:
    for path, text in {
        "src/app.py": "def main():\n    return 42\n",
        "src/util/helpers.py": "def helper():\n    return 'main'\n",
        "src/web.ts": "export const main = 1;\n",
        "README.md": "# main project\n",
        ".git/config": "main = secret\n",
        "node_modules/x/index.js": "main\n",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "image.bin").write_bytes(b"main\x00\x01")


def test_glob_translation() -> None:
    assert compile_glob("**/*.py").match("a/b/c.py") and compile_glob("**/*.py").match("c.py")
    assert not compile_glob("*.py").match("a/c.py")
    assert compile_glob("src/*.{py,ts}").match("src/web.ts")
    assert compile_glob("file?.[ch]").match("file1.c") and not compile_glob("f[!a]").match("fa")


async def test_glob(make_kit: Make, workspace: Path) -> None:
    tree(workspace)
    kit = await make_kit()
    result = await kit.execute("glob", {"pattern": "**/*.py"})
    assert result.data["matches"] == ["src/app.py", "src/util/helpers.py"]
    braces = await kit.execute("glob", {"pattern": "src/*.{py,ts}"})
    assert braces.data["matches"] == ["src/app.py", "src/web.ts"]
    nothing = await kit.execute("glob", {"pattern": "*.rs"})
    assert nothing.data["matches"] == [] and "no files match" in nothing.output


async def test_glob_limit(make_kit: Make, workspace: Path) -> None:
    for n in range(5):
        (workspace / f"f{n}.txt").write_text("")
    kit = await make_kit({"glob": {"max_entries": 3}})
    result = await kit.execute("glob", {"pattern": "*.txt"})
    assert len(result.data["matches"]) == 3 and result.data["more"] is True


async def test_grep(make_kit: Make, workspace: Path) -> None:
    tree(workspace)
    kit = await make_kit()
    result = await kit.execute("grep", {"pattern": r"\bmain\b"})
    paths = [(m["path"], m["line"]) for m in result.data["matches"]]
    assert paths == [
        ("README.md", 1),
        ("src/app.py", 1),
        ("src/util/helpers.py", 2),
        ("src/web.ts", 1),
    ]
    assert "src/app.py:1: def main():" in result.output  # .git, node_modules, binaries skipped
    only_py = await kit.execute("grep", {"pattern": "main", "include": "*.py"})
    assert {m["path"] for m in only_py.data["matches"]} == {"src/app.py", "src/util/helpers.py"}
    by_path = await kit.execute("grep", {"pattern": "main", "include": "src/util/*"})
    assert [m["path"] for m in by_path.data["matches"]] == ["src/util/helpers.py"]
    in_folder = await kit.execute("grep", {"pattern": "return", "path": "src/util"})
    assert [m["path"] for m in in_folder.data["matches"]] == ["src/util/helpers.py"]
    one_file = await kit.execute("grep", {"pattern": "return", "path": "src/app.py"})
    assert one_file.data["matches"] == [{"path": "src/app.py", "line": 2, "text": "    return 42"}]


async def test_grep_reads_a_symlink_to_a_file_of_the_workspace(
    make_kit: Make, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "docs").mkdir()
    (workspace / "docs" / "guide.md").write_text("the needle\n")
    (workspace / "GUIDE.md").symlink_to("docs/guide.md")
    outside = tmp_path / "outside.md"
    outside.write_text("the needle\n")
    (workspace / "away.md").symlink_to(outside)
    kit = await make_kit()
    result = await kit.execute("grep", {"pattern": "needle"})
    assert [m["path"] for m in result.data["matches"]] == ["GUIDE.md", "docs/guide.md"]


async def test_grep_limit_and_bad_patterns(make_kit: Make, workspace: Path) -> None:
    (workspace / "many.txt").write_text("hit\n" * 50)
    kit = await make_kit({"grep": {"max_results": 10}})
    limited = await kit.execute("grep", {"pattern": "hit"})
    assert len(limited.data["matches"]) == 10 and limited.data["more"] is True
    broken = await kit.execute("grep", {"pattern": "(unclosed"})
    assert not broken.success and "invalid regular expression" in broken.error


async def test_grep_stops_a_catastrophic_pattern(make_kit: Make, workspace: Path) -> None:
    (workspace / "evil.txt").write_text("x" * 3000 + "\n")
    kit = await make_kit()
    result = await kit.execute("grep", {"pattern": "(x+x+)+y"})
    assert not result.success and "simplify it" in result.error


def test_grep_stops_working_once_its_call_is_over(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a slow pattern may take up to 2 s on each line: past the deadline the worker thread went
    # on through every line of every file, long after the caller had its timeout
    from toolmesh.sources.builtins import search
    from toolmesh.sources.builtins.confine import Roots
    from toolmesh.sources.builtins.files import FileSettings
    from toolmesh.tools import ToolContext

    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text("slow line\n" * 50)
    ctx = ToolContext(tool_name="grep")
    searched: list[str] = []

    class Pattern:  # the deadline passes during the first line searched
        def search(self, line: str, timeout: float) -> object:
            searched.append(line)
            ctx.cancel_event().set()
            return None

    monkeypatch.setattr(search.regex, "compile", lambda pattern: Pattern())
    search._grep(Roots([workspace]), FileSettings(), "slow", None, None, ctx)
    assert len(searched) == 1
