"""The escape corpus of the file tools: every attempt to leave the workspace is refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.sources.builtins.conftest import SECRET, Make
from toolmesh import ToolErrorCode, create_toolkit
from toolmesh.sources.builtins.confine import MAX_NAME, MAX_PATH, PathRefused, Roots


@pytest.fixture
def traps(workspace: Path, outside: Path) -> Path:
    """Symlinks and a hard link planted inside the workspace, all leading outside."""
    os.symlink(outside / "secret.txt", workspace / "link")
    os.symlink(outside, workspace / "sub")
    os.symlink(workspace / "link", workspace / "chain")  # a symlink to a symlink that escapes
    os.link(outside / "secret.txt", workspace / "hard")
    (workspace / "inner").mkdir()
    os.symlink("../../outside/secret.txt", workspace / "inner" / "relative-link")
    return workspace


ESCAPES = [
    ("dotdot", "../outside/secret.txt", "uses '..'"),
    ("dotdot deep", "inner/../../outside/secret.txt", "uses '..'"),
    ("absolute", "/etc/passwd", "absolute path"),
    ("symlink out", "link", "symlink that points outside"),
    ("symlink chain", "chain", "symlink that points outside"),
    ("relative symlink", "inner/relative-link", "symlink that points outside"),
    ("symlinked parent", "sub/secret.txt", "parent folder 'sub'"),
    ("symlinked parent, new file", "sub/new.txt", "parent folder 'sub'"),
    ("NUL byte", "a\x00b", "NUL byte"),
    ("very long path", "a/" * (MAX_PATH // 2), "too long"),
    ("very long name", "x" * (MAX_NAME + 1), "too long"),
    ("hard link", "hard", "hard links"),
]


@pytest.mark.parametrize(("label", "path", "reason"), ESCAPES, ids=[e[0] for e in ESCAPES])
@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file"])
async def test_escapes_are_refused(
    make_kit: Make, traps: Path, outside: Path, label: str, path: str, reason: str, tool: str
) -> None:
    kit = await make_kit()
    args = {
        "read_file": {"path": path},
        "write_file": {"path": path, "content": "pwned"},
        "edit_file": {"path": path, "old": "secret", "new": "pwned"},
    }[tool]
    result = await kit.execute(tool, args)
    assert not result.success and result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert reason in (result.error or "")
    assert SECRET not in (result.output or "")
    assert (outside / "secret.txt").read_text() == SECRET
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_absolute_path_to_the_secret_is_refused(make_kit: Make, outside: Path) -> None:
    kit = await make_kit()
    result = await kit.execute("read_file", {"path": str(outside / "secret.txt")})
    assert result.error_code == ToolErrorCode.TOOL_DENIED and "absolute path" in result.error


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("list_files", {"path": ".."}),
        ("list_files", {"path": "sub"}),
        ("glob", {"pattern": "../*"}),
        ("glob", {"pattern": "/etc/*"}),
        ("grep", {"pattern": "secret", "path": "../outside"}),
        ("grep", {"pattern": "secret", "path": "sub"}),
        ("grep", {"pattern": "secret", "include": "../*"}),
        (
            "apply_patch",
            {
                "patch": "--- a/../outside/secret.txt\n+++ b/../outside/secret.txt\n@@ -1 +1 @@\n-the secret outside the workspace\n+pwned\n"
            },
        ),
        (
            "apply_patch",
            {
                "patch": "--- a/link\n+++ b/link\n@@ -1 +1 @@\n-the secret outside the workspace\n+pwned\n"
            },
        ),
    ],
)
async def test_the_other_file_tools_refuse_escapes(
    make_kit: Make, traps: Path, outside: Path, tool: str, args: dict[str, str]
) -> None:
    kit = await make_kit()
    result = await kit.execute(tool, args)
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert (outside / "secret.txt").read_text() == SECRET


async def test_grep_and_glob_do_not_follow_links_out(make_kit: Make, traps: Path) -> None:
    (traps / "mine.txt").write_text("my own secret\n")
    kit = await make_kit()
    grep = await kit.execute("grep", {"pattern": "secret"})
    assert grep.success and [m["path"] for m in grep.data["matches"]] == ["mine.txt"]
    glob = await kit.execute("glob", {"pattern": "**/*.txt"})
    assert glob.data["matches"] == ["mine.txt"]


async def test_links_that_stay_inside_are_fine(make_kit: Make, workspace: Path) -> None:
    (workspace / "real").mkdir()
    (workspace / "real" / "a.txt").write_text("inside\n")
    os.symlink("real", workspace / "alias")
    kit = await make_kit()
    result = await kit.execute("read_file", {"path": "alias/a.txt"})
    assert result.success and result.data["content"] == "inside\n"
    inside = await kit.execute("read_file", {"path": "real/../real/a.txt"})
    assert inside.success
    absolute = await kit.execute("read_file", {"path": str(workspace / "real" / "a.txt")})
    assert absolute.success


def test_roots_check_the_opened_descriptor(workspace: Path, outside: Path) -> None:
    roots = Roots([workspace])
    target = roots.resolve("swapped")
    (workspace / "swapped").write_text("mine")
    with roots.open(target, os.O_RDONLY):
        pass
    os.unlink(workspace / "swapped")
    os.symlink(outside / "secret.txt", workspace / "swapped")  # swapped in after the check
    with pytest.raises(OSError), roots.open(target, os.O_RDONLY):  # O_NOFOLLOW: ELOOP
        pass


def test_hard_links_may_be_allowed(workspace: Path, outside: Path) -> None:
    os.link(outside / "secret.txt", workspace / "hard")
    with pytest.raises(PathRefused, match="hard links"):
        Roots([workspace]).check_file(str(workspace / "hard"))
    assert Roots([workspace], allow_hardlinks=True).check_file(str(workspace / "hard"))


def test_a_path_must_be_text(workspace: Path) -> None:
    with pytest.raises(PathRefused, match="must be a string"):
        Roots([workspace]).resolve(b"x")  # type: ignore[arg-type]


async def test_special_files_are_refused(make_kit: Make, workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")  # opening it for reading would block forever
    kit = await make_kit()
    result = await kit.execute("read_file", {"path": "pipe"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED and "not a regular file" in result.error
    edit = await kit.execute("edit_file", {"path": "pipe", "old": "a", "new": "b"})
    assert edit.error_code == ToolErrorCode.TOOL_DENIED
    grep = await kit.execute("grep", {"pattern": "a"})
    assert grep.success and grep.data["skipped_files"] == 1


def swap_after_check(monkeypatch: pytest.MonkeyPatch, swap: Any) -> None:
    """Run ``swap`` right after the path check passes: the race, at a point the test controls."""
    check = Roots.resolve

    def resolve_then_swap(self: Roots, path: str, **kwargs: Any) -> str:
        real = check(self, path, **kwargs)
        swap()
        return real

    monkeypatch.setattr(Roots, "resolve", resolve_then_swap)


def folder_to_symlink(folder: Path, target: Path) -> None:
    folder.rename(folder.with_name(folder.name + ".old"))
    os.symlink(target, folder)


async def test_list_files_does_not_follow_a_folder_swapped_for_a_symlink(
    make_kit: Make, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "flip").mkdir()
    kit = await make_kit()
    swap_after_check(monkeypatch, lambda: folder_to_symlink(workspace / "flip", outside))
    result = await kit.execute("list_files", {"path": "flip"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert "'flip' changed to a symlink" in result.error


async def test_list_files_checks_the_opened_folder(
    make_kit: Make, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the parent is swapped: O_NOFOLLOW cannot see it, the check on the descriptor does
    (outside / "inner").mkdir()
    (workspace / "flip" / "inner").mkdir(parents=True)
    kit = await make_kit()
    swap_after_check(monkeypatch, lambda: folder_to_symlink(workspace / "flip", outside))
    result = await kit.execute("list_files", {"path": "flip/inner"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert "changed to point outside the workspace" in result.error


async def test_write_file_creates_no_folder_through_a_swapped_symlink(
    make_kit: Make, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "r" is missing when checked, then a symlink to outside takes its place before the mkdirs
    kit = await make_kit()
    swap_after_check(monkeypatch, lambda: os.symlink(outside, workspace / "r"))
    result = await kit.execute("write_file", {"path": "r/d/f.txt", "content": "x"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert "'r' changed to a symlink" in result.error
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_write_file_creates_no_folder_under_a_swapped_parent(
    make_kit: Make, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "r").mkdir()
    kit = await make_kit()
    swap_after_check(monkeypatch, lambda: folder_to_symlink(workspace / "r", outside))
    result = await kit.execute("write_file", {"path": "r/d/e/f.txt", "content": "x"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_dotdot_after_a_symlink_climbs_from_its_target(
    make_kit: Make, workspace: Path, outside: Path
) -> None:
    # a link that stays inside: "x/y/top/.." is the workspace's parent to the kernel, which
    # follows "top" before the "..", although the text collapses to "x/y"
    (workspace / "x" / "y").mkdir(parents=True)
    os.symlink(workspace, workspace / "x" / "y" / "top")
    climbing = "x/y/top/../outside/secret.txt"
    roots = Roots([workspace])
    with pytest.raises(PathRefused, match="outside the workspace"):
        roots.resolve(climbing)
    assert roots.resolve("x/y/top/x/y") == str(workspace / "x" / "y")
    kit = await make_kit()
    shell = await kit.execute("shell", {"command": f"cat {climbing}"})
    assert shell.error_code == ToolErrorCode.TOOL_DENIED, shell
    assert SECRET not in (shell.output or "")


@pytest.fixture
def linked_workspace(workspace: Path, outside: Path) -> Path:
    """The workspace given through a symlink (as macOS's /tmp is), with a file and a trap."""
    (workspace / "a.txt").write_text("inside\n")
    os.symlink(outside, workspace / "out")
    link = workspace.parent / "ws-link"
    os.symlink(workspace, link)
    return link


async def test_absolute_paths_through_a_symlinked_workspace_are_inside(
    linked_workspace: Path, workspace: Path, outside: Path
) -> None:
    # the path spelled with the workspace as configured was refused as "outside the workspace"
    kit = await create_toolkit(builtins=True, workspace=linked_workspace)
    try:
        for folder in (linked_workspace, workspace):
            read = await kit.execute("read_file", {"path": str(folder / "a.txt")})
            assert read.success and read.data["content"] == "inside\n", read
        wrote = await kit.execute(
            "write_file", {"path": str(linked_workspace / "new" / "b.txt"), "content": "b\n"}
        )
        assert wrote.success, wrote
        assert (workspace / "new" / "b.txt").read_text() == "b\n"
        # the resolved path still decides: through the link, a way out is still refused
        for path, reason in [
            (linked_workspace / "out" / "secret.txt", "symlink that leads outside"),
            (linked_workspace / ".." / "outside" / "secret.txt", "absolute path"),
            (f"{linked_workspace}/../outside/secret.txt", "absolute path"),
        ]:
            result = await kit.execute("read_file", {"path": str(path)})
            assert result.error_code == ToolErrorCode.TOOL_DENIED, (path, result)
            assert reason in result.error and SECRET not in (result.output or "")
    finally:
        await kit.close()


def test_roots_accept_both_spellings_of_a_symlinked_root(
    linked_workspace: Path, workspace: Path
) -> None:
    roots = Roots([linked_workspace])
    real = str(workspace.resolve() / "a.txt")
    assert roots.resolve(str(linked_workspace / "a.txt")) == real
    assert roots.resolve(str(workspace / "a.txt")) == real
    assert roots.resolve("a.txt") == real
    with pytest.raises(PathRefused, match="symlink"):
        roots.resolve(str(linked_workspace / "out" / "secret.txt"))
