"""read_file, write_file, edit_file, list_files: what they do inside the workspace."""

from __future__ import annotations

import os
import threading
import tracemalloc
from pathlib import Path

from tests.sources.builtins.conftest import Make
from toolmesh import ToolErrorCode


async def test_write_creates_parents_and_read_pages(make_kit: Make, workspace: Path) -> None:
    kit = await make_kit()
    text = "".join(f"line {n}\n" for n in range(1, 11))
    written = await kit.execute("write_file", {"path": "a/b/c.txt", "content": text})
    assert written.success and written.data == {"path": "a/b/c.txt", "bytes": 71, "created": True}
    assert (workspace / "a" / "b" / "c.txt").read_text() == text
    page = await kit.execute("read_file", {"path": "a/b/c.txt", "offset": 3, "limit": 2})
    assert page.data["content"] == "line 3\nline 4\n" and page.data["more"] is True
    assert "read on with offset=5" in page.output
    rest = await kit.execute("read_file", {"path": "a/b/c.txt", "offset": 9})
    assert rest.data["content"] == "line 9\nline 10\n" and rest.data["total_lines"] == 10
    past = await kit.execute("read_file", {"path": "a/b/c.txt", "offset": 50})
    assert "past the end" in past.output


async def test_read_limits_bytes_and_describes_binary(make_kit: Make, workspace: Path) -> None:
    kit = await make_kit({"read_file": {"max_read_bytes": 1000}})
    (workspace / "big.txt").write_text("x" * 5000 + "\nsecond\n")
    big = await kit.execute("read_file", {"path": "big.txt"})
    assert big.success and len(big.data["content"]) <= 1001 and big.data["more"]
    (workspace / "blob.bin").write_bytes(b"\x89PNG\x00\x01\x02" * 100)
    blob = await kit.execute("read_file", {"path": "blob.bin"})
    assert blob.data == {"path": "blob.bin", "binary": True, "size": 700}
    assert "binary file" in blob.output


async def test_a_huge_line_is_not_read_whole(make_kit: Make, workspace: Path) -> None:
    kit = await make_kit({"read_file": {"max_read_bytes": 1000}})
    with (workspace / "one-line.txt").open("wb") as handle:
        handle.write(b"x" * (32 << 20))  # 32 MiB without a newline, then a short line
        handle.write(b"\nsecond\n")
    tracemalloc.start()
    try:
        head = await kit.execute("read_file", {"path": "one-line.txt"})
        after = await kit.execute("read_file", {"path": "one-line.txt", "offset": 2})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert head.success and head.data["content"] == "x" * 1000 + "\n" and head.data["more"]
    assert after.data["content"] == "second\n" and after.data["total_lines"] == 2
    assert peak < 8 << 20


async def test_read_errors_are_clear(make_kit: Make, workspace: Path) -> None:
    kit = await make_kit()
    missing = await kit.execute("read_file", {"path": "nope.txt"})
    assert missing.error_code == ToolErrorCode.TOOL_ERROR and "no file 'nope.txt'" in missing.error
    (workspace / "d").mkdir()
    folder = await kit.execute("read_file", {"path": "d"})
    assert "is a folder" in folder.error
    bad = await kit.execute("read_file", {"path": "x", "offset": 0})
    assert bad.error_code == ToolErrorCode.INVALID_ARGUMENTS


async def test_write_replaces_atomically_and_keeps_the_mode(
    make_kit: Make, workspace: Path
) -> None:
    target = workspace / "run.sh"
    target.write_text("old\n")
    target.chmod(0o755)
    kit = await make_kit()
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:  # a reader racing the writes sees whole files only
        while not stop.is_set():
            seen.add(target.read_text())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for n in range(20):
            result = await kit.execute("write_file", {"path": "run.sh", "content": f"{n}\n" * 1000})
            assert result.success and result.data["created"] is False
    finally:
        stop.set()
        watcher.join()
    assert all(s == "old\n" or (len(set(s.split())) == 1 and len(s.split()) == 1000) for s in seen)
    assert target.stat().st_mode & 0o777 == 0o755
    assert sorted(os.listdir(workspace)) == ["run.sh"]  # no temporary file left behind


async def test_write_limits_and_folder(make_kit: Make, workspace: Path) -> None:
    kit = await make_kit({"write_file": {"max_write_bytes": 10}})
    big = await kit.execute("write_file", {"path": "x.txt", "content": "x" * 11})
    assert "limit is 10" in big.error and not (workspace / "x.txt").exists()
    (workspace / "d").mkdir()
    folder = await kit.execute("write_file", {"path": "d", "content": "x"})
    assert "is a folder" in folder.error
    (workspace / "f").write_text("x")
    under_file = await kit.execute("write_file", {"path": "f/g.txt", "content": "x"})
    assert "not a folder" in under_file.error and under_file.error_code == "tool_denied"


async def test_edit_must_be_unique_unless_replace_all(make_kit: Make, workspace: Path) -> None:
    (workspace / "code.py").write_text("a = 1\nb = 1\nc = 2\n")
    kit = await make_kit()
    twice = await kit.execute("edit_file", {"path": "code.py", "old": "= 1", "new": "= 3"})
    assert not twice.success and "occurs 2 times" in twice.error
    assert (workspace / "code.py").read_text() == "a = 1\nb = 1\nc = 2\n"
    once = await kit.execute("edit_file", {"path": "code.py", "old": "b = 1", "new": "b = 5"})
    assert once.success and once.data["replacements"] == 1
    every = await kit.execute(
        "edit_file", {"path": "code.py", "old": "= ", "new": "== ", "replace_all": True}
    )
    assert every.data["replacements"] == 3
    assert (workspace / "code.py").read_text() == "a == 1\nb == 5\nc == 2\n"
    absent = await kit.execute("edit_file", {"path": "code.py", "old": "zzz", "new": "y"})
    assert "does not occur" in absent.error
    empty = await kit.execute("edit_file", {"path": "code.py", "old": "", "new": "y"})
    assert empty.error_code == ToolErrorCode.INVALID_ARGUMENTS


async def test_list_files(make_kit: Make, workspace: Path) -> None:
    (workspace / "b.txt").write_text("12345")
    (workspace / "a").mkdir()
    os.symlink("b.txt", workspace / "c")
    kit = await make_kit({"list_files": {"max_entries": 2}})
    top = await kit.execute("list_files", {})
    assert top.data["entries"] == [
        {"name": "a", "type": "dir", "size": None},
        {"name": "b.txt", "type": "file", "size": 5},
    ]
    assert top.data["more"] == 1 and top.output.splitlines()[:2] == ["a/", "b.txt  (5 bytes)"]
    not_folder = await kit.execute("list_files", {"path": "b.txt"})
    assert "not a folder" in not_folder.error


async def test_a_long_non_ascii_name_can_be_written(make_kit: Make, workspace: Path) -> None:
    name = "é" * 120 + ".txt"  # 244 bytes: a legal name whose temporary copy must fit too
    kit = await make_kit()
    written = await kit.execute("write_file", {"path": name, "content": "x"})
    assert written.success, written.error
    assert (workspace / name).read_text() == "x"


def test_a_deletion_cannot_follow_a_folder_swapped_for_a_symlink(
    workspace: Path, outside: Path
) -> None:
    import pytest

    from toolmesh.sources.builtins.confine import Roots
    from toolmesh.sources.builtins.files import checked_unlink

    (workspace / "sub").mkdir()
    (workspace / "sub" / "f").write_text("mine")
    (outside / "f").write_text("theirs")
    real = Roots([workspace]).resolve("sub/f")  # checked while sub was a folder
    (workspace / "sub" / "f").unlink()
    (workspace / "sub").rmdir()
    (workspace / "sub").symlink_to(outside)  # then swapped, before the deletion
    with pytest.raises(OSError):
        checked_unlink(Roots([workspace]), real)
    assert (outside / "f").read_text() == "theirs"


async def test_a_full_default_page_keeps_its_data_and_how_to_read_on(
    make_kit: Make, workspace: Path
) -> None:
    (workspace / "big.txt").write_text(("x" * 99 + "\n") * 5000)  # 500 KB of lines
    kit = await make_kit()
    page = await kit.execute("read_file", {"path": "big.txt"})
    assert page.success and not page.truncated  # the output bound would drop the data
    assert page.data["more"] is True and "read on with offset=" in page.output


async def test_a_replaced_file_does_not_keep_set_id_bits(make_kit: Make, workspace: Path) -> None:
    # the new file belongs to toolmesh's user: a kept set-user-ID bit would make the model's
    # text a program running as that user (root, when toolmesh runs as root)
    target = workspace / "tool.sh"
    target.write_text("#!/bin/sh\necho old\n")
    os.chmod(target, 0o6755)
    kit = await make_kit()
    result = await kit.execute(
        "write_file", {"path": "tool.sh", "content": "#!/bin/sh\necho new\n"}
    )
    assert result.success, result
    assert target.stat().st_mode & 0o7777 == 0o755
    edited = await kit.execute("edit_file", {"path": "tool.sh", "old": "new", "new": "newer"})
    assert edited.success and target.stat().st_mode & 0o7777 == 0o755
