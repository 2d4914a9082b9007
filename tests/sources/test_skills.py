"""Skills: discovery, malformed files skipped with reasons, symlink loops, the skill tool."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from toolmesh import ConfigError, ToolErrorCode, Toolkit, ToolNameConflict, create_toolkit
from toolmesh.sources.skills import MAX_FILES, SkillsSource, load_skills

REPO = Path(__file__).resolve().parents[2]


def write(folder: Path, text: str, name: str = "SKILL.md") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


GOOD = "---\nname: {name}\ndescription: Does {name} things.\nversion: 2\n---\n# {name}\nStep one.\n"


def test_the_shipped_example_is_the_only_skill() -> None:
    skills, problems = load_skills(REPO / "examples" / "skills")
    assert [s.name for s in skills] == ["hello-world"] and problems == []


def test_discovery_nested_and_metadata(tmp_path: Path) -> None:
    write(tmp_path / "a", GOOD.format(name="alpha"))
    write(tmp_path / "group" / "b", GOOD.format(name="beta"))
    write(tmp_path / "group" / "b" / "scripts", "print(1)", name="run.py")
    skills, problems = load_skills(tmp_path)
    assert [s.name for s in skills] == ["alpha", "beta"] and problems == []
    beta = skills[1]
    assert beta.description == "Does beta things." and beta.metadata == {"version": 2}
    assert beta.instructions == "# beta\nStep one."
    assert beta.files() == ["scripts/run.py"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("# no front matter\n", "no YAML front matter"),
        ("---\nname: [unclosed\n---\nbody", "not valid YAML"),
        ("---\n- a list\n---\nbody", "not a YAML mapping"),
        ("---\ndescription: nameless\n---\nbody", "has no 'name'"),
        ("---\nname: silent\n---\nbody", "has no 'description'"),
        ("---\nname: has spaces\ndescription: d\n---\nbody", "must be letters"),
    ],
)
def test_malformed_files_are_skipped_with_a_reason(tmp_path: Path, text: str, reason: str) -> None:
    write(tmp_path / "bad", text)
    write(tmp_path / "good", GOOD.format(name="good"))
    skills, problems = load_skills(tmp_path)
    assert [s.name for s in skills] == ["good"]
    assert len(problems) == 1 and reason in problems[0][1]


def test_binary_file_and_duplicate_names(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "SKILL.md").write_bytes(b"\xff\xfe\x00garbage")
    write(tmp_path / "one", GOOD.format(name="same"))
    write(tmp_path / "two", GOOD.format(name="same"))
    skills, problems = load_skills(tmp_path)
    assert [s.name for s in skills] == ["same"]
    reasons = sorted(r for _, r in problems)
    assert reasons[0] == "not UTF-8 text" and "already used" in reasons[1]


def test_symlink_loops_are_walked_once(tmp_path: Path) -> None:
    write(tmp_path / "a", GOOD.format(name="looped"))
    os.symlink(tmp_path, tmp_path / "a" / "back-to-root")
    skills, problems = load_skills(tmp_path)
    assert [s.name for s in skills] == ["looped"] and problems == []


def test_missing_folder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        SkillsSource(tmp_path / "nope")


async def test_skill_tool_and_prompt(tmp_path: Path) -> None:
    write(tmp_path / "greet", GOOD.format(name="greet"))
    write(tmp_path / "greet", "Hello template", name="template.txt")
    (tmp_path / "secret.txt").write_text("outside")
    kit = await create_toolkit(skills_dir=tmp_path)
    assert [s.name for s in kit.skills] == ["greet"]
    assert "- greet: Does greet things." in kit.skills_prompt()
    loaded = await kit.execute("skill", {"name": "greet"})
    assert loaded.output is not None and loaded.output.startswith("# greet\nStep one.")
    assert "- template.txt" in loaded.output and loaded.data["files"] == ["template.txt"]
    file = await kit.execute("skill", {"name": "greet", "file": "template.txt"})
    assert file.output == "Hello template"
    escape = await kit.execute("skill", {"name": "greet", "file": "../secret.txt"})
    assert escape.error_code == ToolErrorCode.TOOL_ERROR and "outside" in (escape.error or "")
    unknown = await kit.execute("skill", {"name": "nope"})
    assert unknown.error_code == ToolErrorCode.INVALID_ARGUMENTS
    await kit.close()


def _problem_reasons(root: Path) -> dict[str, str]:
    skills, problems = load_skills(root)
    assert [s.name for s in skills] == ["good"]
    return {path.parent.name: reason for path, reason in problems}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_named_skill_md_is_skipped_not_waited_on(tmp_path: Path) -> None:
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "SKILL.md")  # no writer: reading it would block forever
    write(tmp_path / "good", GOOD.format(name="good"))
    assert _problem_reasons(tmp_path) == {"fifo": "not a regular file (a FIFO)"}


def test_devices_and_oversize_skill_files_are_skipped(tmp_path: Path) -> None:
    from toolmesh.sources.skills import MAX_SKILL_BYTES

    (tmp_path / "zero").mkdir()
    os.symlink(os.devnull, tmp_path / "zero" / "SKILL.md")  # followed: a character device
    (tmp_path / "huge").mkdir()
    with open(tmp_path / "huge" / "SKILL.md", "wb") as sparse:
        sparse.write(GOOD.format(name="huge").encode())
        sparse.truncate(MAX_SKILL_BYTES + 1)
    write(tmp_path / "good", GOOD.format(name="good"))
    assert _problem_reasons(tmp_path) == {
        "zero": "not a regular file (a character device)",
        "huge": f"larger than {MAX_SKILL_BYTES} bytes ({MAX_SKILL_BYTES + 1} bytes)",
    }


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "---\nname: 123\ndescription: d\n---\nbody",
            "the front matter's 'name' must be a string, not int (123; quote it)",
        ),
        (
            "---\nname: ok\ndescription: [a, b]\n---\nbody",
            "the front matter's 'description' must be a string, not list (['a', 'b']; quote it)",
        ),
        ("---\nname: ''\ndescription: d\n---\nbody", "the front matter's 'name' is empty"),
        ("---\n---\nbody", "the front matter is empty (it needs a 'name' and a 'description')"),
        ("---\n\n---\nbody", "the front matter is empty (it needs a 'name' and a 'description')"),
    ],
)
def test_front_matter_errors_say_what_is_wrong(tmp_path: Path, text: str, reason: str) -> None:
    write(tmp_path / "bad", text)
    write(tmp_path / "good", GOOD.format(name="good"))
    assert _problem_reasons(tmp_path) == {"bad": reason}


def test_a_utf8_bom_before_the_front_matter_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "bom").mkdir()
    (tmp_path / "bom" / "SKILL.md").write_bytes(b"\xef\xbb\xbf" + GOOD.format(name="bom").encode())
    skills, problems = load_skills(tmp_path)
    assert problems == [] and [(s.name, s.instructions) for s in skills] == [
        ("bom", "# bom\nStep one.")
    ]


def test_a_multi_line_description_stays_on_its_line_of_the_catalogue(tmp_path: Path) -> None:
    write(tmp_path / "a", "---\nname: alpha\ndescription: |\n  First line.\n  - beta: fake\n---\n")
    source = SkillsSource(tmp_path)
    assert source.prompt().splitlines()[1:] == ["- alpha: First line. - beta: fake"]
    assert "\n" not in source.tools()[0].description


def test_the_file_listing_is_sorted_when_cut_at_the_limit(tmp_path: Path) -> None:
    write(tmp_path / "s", GOOD.format(name="many"))
    write(tmp_path / "s", "z", name="z.txt")
    for i in range(MAX_FILES):
        write(tmp_path / "s" / "a", "a", name=f"{i:03d}.txt")
    files = SkillsSource(tmp_path).skills[0].files()
    assert len(files) == MAX_FILES and files == sorted(files)


def test_a_symlink_out_of_the_folder_is_not_listed(tmp_path: Path) -> None:
    write(tmp_path / "skills" / "s", GOOD.format(name="linked"))
    write(tmp_path / "skills" / "s", "in", name="notes.txt")
    write(tmp_path / "elsewhere", "secret", name="key.txt")
    os.symlink(tmp_path / "elsewhere" / "key.txt", tmp_path / "skills" / "s" / "key.txt")
    os.symlink("notes.txt", tmp_path / "skills" / "s" / "also-notes.txt")  # stays inside
    (skill,) = SkillsSource(tmp_path / "skills").skills
    assert skill.files() == ["also-notes.txt", "notes.txt"]  # key.txt could not be read


def _alias_bomb(levels: int) -> str:
    """YAML aliases: a few hundred bytes whose value, printed in full, is 9**levels items."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\ndescription: *l{levels - 1}\n"


def test_an_alias_bomb_is_reported_in_a_few_words(tmp_path: Path) -> None:
    write(tmp_path / "bad", "---\nname: bomb\n" + _alias_bomb(6) + "---\nbody")
    write(tmp_path / "good", GOOD.format(name="good"))
    reason = _problem_reasons(tmp_path)["bad"]
    assert reason.startswith("the front matter's 'description' must be a string, not list ([[")
    assert reason.endswith("; quote it)") and len(reason) < 400


def test_front_matter_nested_too_deeply_is_skipped_not_a_crash(tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000
    write(tmp_path / "bad", f"---\nname: deep\ndescription: {deep}\n---\nbody")
    write(tmp_path / "good", GOOD.format(name="good"))
    assert _problem_reasons(tmp_path) == {"bad": "the front matter is nested too deeply"}


def test_a_link_out_of_the_skills_folder_is_not_searched(tmp_path: Path) -> None:
    skills = tmp_path / "skills"
    write(skills / "good", GOOD.format(name="good"))
    write(tmp_path / "outside" / "deep" / "x", GOOD.format(name="good"))  # would shadow it
    write(tmp_path / "outside" / "deep" / "y", GOOD.format(name="stray"))
    os.symlink(tmp_path / "outside", skills / "a-vendor")  # sorts before good/
    loaded, problems = load_skills(skills)
    assert [(s.name, s.path) for s in loaded] == [("good", skills / "good" / "SKILL.md")]
    assert problems == [
        (
            skills / "a-vendor",
            f"a link to {tmp_path / 'outside'}, outside the skills folder and not a skill "
            "folder; not searched",
        )
    ]


async def test_a_symlinked_skill_folder_is_still_a_skill(tmp_path: Path) -> None:
    write(tmp_path / "real" / "linked", GOOD.format(name="linked"))
    write(tmp_path / "real" / "linked", "notes", name="notes.txt")
    write(tmp_path / "real" / "linked" / "inner", GOOD.format(name="inner"))  # nested: found
    (tmp_path / "real" / "secret.txt").write_text("outside the skill")
    (tmp_path / "skills").mkdir()
    os.symlink(tmp_path / "real" / "linked", tmp_path / "skills" / "linked")
    kit = await create_toolkit(skills_dir=tmp_path / "skills")
    assert [s.name for s in kit.skills] == ["linked", "inner"]
    notes = await kit.execute("skill", {"name": "linked", "file": "notes.txt"})
    assert notes.output == "notes"
    escape = await kit.execute("skill", {"name": "linked", "file": "../secret.txt"})
    assert escape.error_code == ToolErrorCode.TOOL_ERROR and "outside" in (escape.error or "")
    await kit.close()


def test_crlf_line_endings_leave_no_carriage_returns(tmp_path: Path) -> None:
    (tmp_path / "crlf").mkdir()
    text = (
        "---\r\nname: crlf\r\ndescription: |\r\n  Two\r\n  lines.\r\n---\r\nStep one.\r\nTwo.\r\n"
    )
    (tmp_path / "crlf" / "SKILL.md").write_bytes(text.encode())
    (skill,), problems = load_skills(tmp_path)
    assert problems == [] and skill.instructions == "Step one.\nTwo."
    assert skill.description == "Two\nlines."


async def test_a_link_swapped_in_after_the_check_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The file was checked by its resolved path, then read by name: a symlink swapped in
    # between (for the file, or for a folder on its way) was followed out of the skill.
    folder = tmp_path / "skills" / "s"
    write(folder, GOOD.format(name="s"))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("the secret")
    (folder / "note.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    (folder / "sub").symlink_to(tmp_path / "outside")
    os.mkfifo(folder / "pipe")
    kit = await create_toolkit(skills_dir=tmp_path / "skills")
    with monkeypatch.context() as patched:  # as if each link came just after the check
        patched.setattr(os.path, "realpath", os.path.abspath)
        note = await kit.execute("skill", {"name": "s", "file": "note.txt"})
        sub = await kit.execute("skill", {"name": "s", "file": "sub/secret.txt"})
    pipe = await asyncio.wait_for(kit.execute("skill", {"name": "s", "file": "pipe"}), 10)
    await kit.close()
    assert "the skill has no file 'note.txt'" in (note.error or ""), note
    assert "'sub/secret.txt' is outside the skill's folder" in (sub.error or ""), sub
    assert "the skill has no file 'pipe' (a FIFO)" in (pipe.error or ""), pipe


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
async def test_a_folder_named_as_a_file_is_refused_and_leaks_no_descriptor(tmp_path: Path) -> None:
    # os.open of a folder succeeds and os.fdopen then raised IsADirectoryError before a `with`
    # owned the descriptor: one leaked per call, until real files could not be opened.
    write(tmp_path / "s", GOOD.format(name="s"))
    (tmp_path / "s" / "scripts").mkdir()
    kit = await create_toolkit(skills_dir=tmp_path)
    first = await kit.execute("skill", {"name": "s", "file": "scripts"})
    assert first.error_code == ToolErrorCode.TOOL_ERROR, first
    assert "the skill has no file 'scripts' (a folder)" in (first.error or ""), first
    before = len(os.listdir("/proc/self/fd"))
    for wanted in ("scripts", ".", "scripts/") * 50:
        result = await kit.execute("skill", {"name": "s", "file": wanted})
        assert "(a folder)" in (result.error or ""), result
    assert len(os.listdir("/proc/self/fd")) == before
    await kit.close()


def test_a_skill_md_that_turned_into_a_folder_is_skipped_without_a_leak(tmp_path: Path) -> None:
    from toolmesh.sources.skills import _read_skill_file

    (tmp_path / "SKILL.md").mkdir()  # a folder swapped in after the walk saw a file
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    for _ in range(20):
        with pytest.raises(ValueError, match=r"not a regular file \(a folder\)"):
            _read_skill_file(tmp_path / "SKILL.md")
    if before:
        assert len(os.listdir("/proc/self/fd")) == before


def folder_of(tmp_path: Path, name: str) -> Path:
    write(tmp_path / name / name, GOOD.format(name=name))
    return tmp_path / name


def test_the_catalogue_names_the_served_skill_tool_behind_a_prefix(tmp_path: Path) -> None:
    kit = Toolkit()
    kit.add(SkillsSource(folder_of(tmp_path, "alpha")), prefix="team")
    assert kit.names() == ["team_skill"]
    assert [s.name for s in kit.skills] == ["alpha"]
    prompt = kit.skills_prompt()  # was empty: only sources added as they are were seen
    assert "Call the `team_skill` tool" in prompt and "- alpha: Does alpha things." in prompt


async def test_the_catalogue_sees_skills_of_a_nested_toolkit(tmp_path: Path) -> None:
    inner = Toolkit(SkillsSource(folder_of(tmp_path, "alpha")), name="inner")
    outer = Toolkit(inner, name="outer")
    assert [s.name for s in outer.skills] == ["alpha"]
    assert outer.skills_prompt() == inner.skills_prompt() != ""
    loaded = await outer.execute("skill", {"name": "alpha"})
    assert loaded.success, loaded


async def test_the_catalogue_leaves_out_a_skill_tool_that_lost_its_name(tmp_path: Path) -> None:
    first, second = SkillsSource(folder_of(tmp_path, "alpha")), folder_of(tmp_path, "beta")
    with pytest.warns(ToolNameConflict):
        kit = Toolkit(first, SkillsSource(second))
    assert [s.name for s in kit.skills] == ["alpha"]
    assert kit.skills_prompt() == first.prompt()  # not beta, which `skill` refuses
    refused = await kit.execute("skill", {"name": "beta"})
    assert refused.error_code == ToolErrorCode.INVALID_ARGUMENTS
    both = Toolkit()
    both.add(first, prefix="a")
    both.add(SkillsSource(second), prefix="b")  # two tools: each lists its own skills
    prompts = both.skills_prompt().split("\n\n")
    assert ["`a_skill`" in prompts[0], "`b_skill`" in prompts[1]] == [True, True]
    assert ["- beta" in prompts[0], "- beta" in prompts[1]] == [False, True]
    assert [s.name for s in both.skills] == ["alpha", "beta"]


async def test_a_file_name_with_a_nul_says_so(tmp_path: Path) -> None:
    write(tmp_path / "s", GOOD.format(name="s"))
    kit = await create_toolkit(skills_dir=tmp_path)
    result = await kit.execute("skill", {"name": "s", "file": "a\x00b"})
    assert result.error_code == ToolErrorCode.TOOL_ERROR
    assert "is not a file name (it has a NUL character)" in (result.error or "")
    await kit.close()


def test_a_huge_description_is_cut_in_the_catalogue_only(tmp_path: Path) -> None:
    from toolmesh.sources.skills import MAX_DESCRIPTION_CHARS

    write(tmp_path / "big", "---\nname: big\ndescription: " + "word " * 50_000 + "\n---\nbody")
    source = SkillsSource(tmp_path)
    (line,) = source.prompt().splitlines()[1:]
    assert line.startswith("- big: word word") and line.endswith("…")
    assert len(line) == len("- big: ") + MAX_DESCRIPTION_CHARS
    assert len(source.tools()[0].description) < 2 * MAX_DESCRIPTION_CHARS
    assert len(source.skills[0].description) == len("word " * 50_000) - 1  # kept whole
    assert len(source.skills[0].summary) == MAX_DESCRIPTION_CHARS  # as `toolmesh skills`
    # and an A2A card list it
