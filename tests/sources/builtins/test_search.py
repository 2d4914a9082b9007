"""glob and grep."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sources.builtins.conftest import Make
from toolmesh import ToolErrorCode
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


@pytest.mark.parametrize(
    ("pattern", "matching", "not_matching"),
    [
        ("**/b", ["b", "a/b", "a/x/b"], ["ab", "a/xb"]),
        ("a/**/b", ["a/b", "a/x/y/b"], ["ab", "a/xb", "xa/b"]),
        ("a**/b", ["ab", "a/b", "ax/b", "a/x/b"], ["a/xb"]),  # '**/' inside a name
        ("**.py", ["x.py", "a/b/x.py"], ["x.pyc"]),  # '**' inside a name crosses folders too
        ("*a*a*b", ["aab", "xaxaxb"], ["ab", "a/ab", "aa/b"]),
        ("**a*b", ["ab", "x/ab", "a/ab"], ["a/b", "ba"]),
        ("**a*b**c", ["abc", "x/ab/c", "ab/x/c"], ["a/bc"]),
        ("x[!a]y", ["xby"], ["xay", "x/y"]),  # a class never matches '/'
        ("x[]a]y", ["x]y", "xay"], ["xby"]),  # ']' first is a member
        ("[a", ["[a"], ["a"]),  # nothing closes it: a plain '['
        ("{a,{b,c}}/*", ["a/x", "c/x"], ["d/x", "a"]),
        ("x,}", ["x,}"], ["x"]),  # outside a group ',' and '}' are plain
    ],
)
def test_glob_features(pattern: str, matching: list[str], not_matching: list[str]) -> None:
    regex = compile_glob(pattern)
    assert [path for path in matching if not regex.match(path)] == []
    assert [path for path in not_matching if regex.match(path)] == []


@pytest.mark.parametrize("tool", ["glob", "grep"])
async def test_a_pattern_with_many_stars_answers_at_once(
    make_kit: Make, workspace: Path, tool: str
) -> None:
    # `*a*a*...*b` became `[^/]*a[^/]*a...`, which `re` backtracked on exponentially against a
    # long name, holding the GIL: the event loop froze, the 5 s call answered `timeout` after
    # about 20 s (`*a` nine times: never)
    (workspace / ("a" * 60)).write_text("x\n")
    kit = await make_kit()
    pattern = "*a" * 7 + "*b"
    if tool == "glob":
        result = await kit.execute("glob", {"pattern": pattern}, timeout=5)
        assert result.success, result
        assert result.data["matches"] == []
    else:
        result = await kit.execute("grep", {"pattern": "x", "include": pattern}, timeout=5)
        assert result.success, result
        assert result.data["matches"] == [] and result.data["skipped_files"] == 0


async def test_a_malformed_glob_is_named_in_the_error(make_kit: Make, workspace: Path) -> None:
    (workspace / "a.txt").write_text("x\n")
    kit = await make_kit()
    backwards = await kit.execute("glob", {"pattern": "[z-a]*"})
    assert not backwards.success
    assert "invalid glob pattern '[z-a]*'" in backwards.error and "z-a" in backwards.error
    assert "position" not in backwards.error  # not re's own wording
    included = await kit.execute("grep", {"pattern": "x", "include": "*.[z-a]"})
    assert not included.success and "invalid glob pattern '*.[z-a]'" in included.error
    many = await kit.execute("glob", {"pattern": "{a,b}" * 9})
    assert not many.success and "more than 256 alternatives" in many.error


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


async def test_grep_of_one_file_it_cannot_search_says_why(make_kit: Make, workspace: Path) -> None:
    # it answered "no matches for 'NEEDLE'", with only skipped_files=1 in its data
    (workspace / "big.txt").write_text("NEEDLE\n" + "x" * 100)
    (workspace / "h1").write_text("NEEDLE\n")
    os.link(workspace / "h1", workspace / "h2")
    (workspace / "image.bin").write_bytes(b"NEEDLE\x00")
    kit = await make_kit({"grep": {"max_file_bytes": 64}})
    big = await kit.execute("grep", {"pattern": "NEEDLE", "path": "big.txt"})
    assert big.error_code == ToolErrorCode.TOOL_ERROR
    assert "'big.txt' is 107 bytes, larger than grep's max_file_bytes (64)" in big.error
    linked = await kit.execute("grep", {"pattern": "NEEDLE", "path": "h1"})
    assert linked.error_code == ToolErrorCode.TOOL_DENIED  # as read_file refuses it
    assert "'h1' has 2 hard links" in linked.error
    binary = await kit.execute("grep", {"pattern": "NEEDLE", "path": "image.bin"})
    assert not binary.success and "'image.bin' is a binary file" in binary.error
    missing = await kit.execute("grep", {"pattern": "NEEDLE", "path": "nothing.txt"})
    assert not missing.success and "no file 'nothing.txt'" in missing.error


async def test_grep_says_which_files_it_did_not_search(make_kit: Make, workspace: Path) -> None:
    (workspace / "big.txt").write_text("NEEDLE\n" + "x" * 100)
    (workspace / "small.txt").write_text("nothing here\n")
    kit = await make_kit({"grep": {"max_file_bytes": 64}})
    one = await kit.execute("grep", {"pattern": "NEEDLE"})
    assert one.success and one.data["matches"] == [] and one.data["skipped_files"] == 1
    reason = "'big.txt' is 107 bytes, larger than grep's max_file_bytes (64)"
    assert one.output == (
        f"no matches for 'NEEDLE' in the files searched\n[1 file not searched: {reason}]"
    )
    assert one.data["skipped"] == [{"path": "big.txt", "reason": reason}]
    for n in range(3):
        (workspace / f"image{n}.bin").write_bytes(b"NEEDLE\x00")
        (workspace / f"big{n}.txt").write_text("NEEDLE\n" + "x" * 100)
    (workspace / "small.txt").write_text("NEEDLE\n")
    many = await kit.execute("grep", {"pattern": "NEEDLE"})
    # binary files are counted and listed, not told: they hold no lines to match
    assert many.output == (
        "small.txt:1: NEEDLE\n[4 files not searched: 4 larger than max_file_bytes (64 bytes)]"
    )
    assert many.data["skipped_files"] == 7
    images = await kit.execute("grep", {"pattern": "NEEDLE", "include": "*.bin"})
    assert images.output == "no matches for 'NEEDLE'" and images.data["skipped_files"] == 3
