"""apply_patch: unified diffs, applied whole or not at all."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from tests.sources.builtins.conftest import Make
from toolmesh.sources.builtins.patch import PatchError, parse_patch


def diff(name: str, old: str, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"a/{name}",
            f"b/{name}",
        )
    )


OLD = "".join(f"line {n}\n" for n in range(1, 31))
NEW = OLD.replace("line 3\n", "line three\n").replace("line 25\n", "line 25\nline 25.5\n")


async def test_applies_a_multi_hunk_diff(make_kit: Make, workspace: Path) -> None:
    (workspace / "f.txt").write_text(OLD)
    kit = await make_kit()
    result = await kit.execute("apply_patch", {"patch": diff("f.txt", OLD, NEW)})
    assert result.success, result.error
    assert result.data["files"] == [{"path": "f.txt", "action": "modified", "hunks": 2}]
    assert (workspace / "f.txt").read_text() == NEW


async def test_finds_hunks_that_moved(make_kit: Make, workspace: Path) -> None:
    (workspace / "f.txt").write_text("new first line\nanother\n" + OLD)
    kit = await make_kit()
    result = await kit.execute("apply_patch", {"patch": diff("f.txt", OLD, NEW)})
    assert result.success, result.error
    assert (workspace / "f.txt").read_text() == "new first line\nanother\n" + NEW


async def test_all_or_nothing_across_files(make_kit: Make, workspace: Path) -> None:
    (workspace / "a.txt").write_text(OLD)
    (workspace / "b.txt").write_text("something else entirely\n")
    patch = diff("a.txt", OLD, NEW) + diff("b.txt", "what b used to say\n", "b new\n")
    kit = await make_kit()
    result = await kit.execute("apply_patch", {"patch": patch})
    assert not result.success and "hunk 1 of 'b.txt' does not apply" in result.error
    assert (workspace / "a.txt").read_text() == OLD  # the first file was not touched either


async def test_all_or_nothing_within_a_file(make_kit: Make, workspace: Path) -> None:
    broken = OLD.replace("line 25\n", "line twenty-five\n")
    (workspace / "f.txt").write_text(broken)
    kit = await make_kit()
    result = await kit.execute("apply_patch", {"patch": diff("f.txt", OLD, NEW)})
    assert not result.success and "hunk 2" in result.error
    assert (workspace / "f.txt").read_text() == broken


async def test_create_and_delete(make_kit: Make, workspace: Path) -> None:
    (workspace / "gone.txt").write_text("bye\n")
    patch = (
        "--- /dev/null\n+++ b/new/dir/hello.txt\n@@ -0,0 +1,2 @@\n+hello\n+world\n"
        "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
    )
    kit = await make_kit()
    result = await kit.execute("apply_patch", {"patch": patch})
    assert result.success, result.error
    assert [f["action"] for f in result.data["files"]] == ["created", "deleted"]
    assert (workspace / "new" / "dir" / "hello.txt").read_text() == "hello\nworld\n"
    assert not (workspace / "gone.txt").exists()
    again = await kit.execute("apply_patch", {"patch": patch})
    assert "already exists" in again.error


async def test_no_newline_at_end_of_file(make_kit: Make, workspace: Path) -> None:
    (workspace / "f.txt").write_text("a\nb")
    patch = "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n"
    kit = await make_kit()
    result = await kit.execute("apply_patch", {"patch": patch})
    assert result.success, result.error
    assert (workspace / "f.txt").read_text() == "a\nc\n"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ("just some text\n", "no file changes found"),
        ("@@ -1 +1 @@\n-a\n+b\n", "before any '---'"),
        ("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n", "cut short"),
        ("--- a/x\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n", "renaming"),
        ("diff --git a/x b/y\nrename from x\nrename to y\n", "not supported"),
        ("--- a/x\n+++ b/x\n@@ bogus @@\n", "malformed hunk header"),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "twice"),
    ],
)
def test_malformed_patches(patch: str, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        parse_patch(patch)


def test_git_headers_are_accepted() -> None:
    patch = "diff --git a/x b/x\nindex 123..456 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    (file,) = parse_patch(patch)
    assert file.path == "x" and file.hunks[0].old == ["a"] and file.hunks[0].new == ["b"]


def two_changes(first: str, second: str) -> str:
    """One patch changing line 1 of ``first`` and line 2 of ``second``."""
    return (
        f"--- a/{first}\n+++ b/{first}\n@@ -1,2 +1,2 @@\n-one\n+ONE\n two\n"
        f"--- a/{second}\n+++ b/{second}\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n"
    )


def two_creations(first: str, second: str) -> str:
    return (
        f"--- /dev/null\n+++ b/{first}\n@@ -0,0 +1 @@\n+first\n"
        f"--- /dev/null\n+++ b/{second}\n@@ -0,0 +1 @@\n+second\n"
    )


@pytest.mark.parametrize(
    ("patch", "first", "second"),
    [
        (two_changes("a.txt", "./a.txt"), "a.txt", "./a.txt"),
        (two_changes("a.txt", "sub/../a.txt"), "a.txt", "sub/../a.txt"),
        (two_changes("a.txt", "alias.txt"), "a.txt", "alias.txt"),  # a symlink to a.txt
        (two_changes("sub/b.txt", "linked/b.txt"), "sub/b.txt", "linked/b.txt"),  # via a folder
        (two_creations("new.txt", "./new.txt"), "new.txt", "./new.txt"),
    ],
)
async def test_a_file_named_twice_is_refused(
    make_kit: Make, workspace: Path, patch: str, first: str, second: str
) -> None:
    # the second file patch was computed from the original text too, and its write silently
    # undid the first one's hunks, while the answer reported both as applied
    (workspace / "a.txt").write_text("one\ntwo\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "b.txt").write_text("one\ntwo\n")
    (workspace / "alias.txt").symlink_to("a.txt")
    (workspace / "linked").symlink_to("sub")
    kit = await make_kit()
    result = await kit.execute("apply_patch", {"patch": patch})
    assert not result.success, result
    assert f"{second!r} and {first!r} name the same file" in result.error
    assert (workspace / "a.txt").read_text() == "one\ntwo\n"  # nothing written
    assert (workspace / "sub" / "b.txt").read_text() == "one\ntwo\n"
    assert not (workspace / "new.txt").exists()


async def test_different_files_in_one_patch_still_apply(make_kit: Make, workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\ntwo\n")
    (workspace / "b.txt").write_text("one\ntwo\n")
    kit = await make_kit()
    result = await kit.execute("apply_patch", {"patch": two_changes("a.txt", "./b.txt")})
    assert result.success, result.error
    assert (workspace / "a.txt").read_text() == "ONE\ntwo\n"
    assert (workspace / "b.txt").read_text() == "one\nTWO\n"
