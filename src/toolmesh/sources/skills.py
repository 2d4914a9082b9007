"""Skills: folders with a ``SKILL.md`` (YAML front matter + instructions) that models can load.

Every ``**/SKILL.md`` under the skills folder is one skill. Its front matter needs a ``name`` and a
``description`` (strings); the body is the instructions. A file that cannot be read or parsed
is skipped with a reason (``problems``; ``toolmesh skills`` shows them), never a crash or a hang:
so is a ``SKILL.md`` that is not a regular file (a FIFO, a device) or is larger than
``MAX_SKILL_BYTES`` (1 MiB), or whose front matter is nested too deeply. A leading UTF-8 BOM
is ignored and CRLF line endings read as LF. Symlinks are followed, but a folder reached twice
(a symlink loop) is walked once, and a symlinked folder that leads out of the skills folder is
followed only when it is a skill folder itself (it has a ``SKILL.md``): a link to anywhere else
(``data -> /``) would search, and serve skills from, that whole tree, so it is left out with a
reason.

The source serves one tool, ``skill``: given a skill's name it returns the instructions and the
files of the skill's folder; given also a ``file``, that file's text (confined to the folder).
``SkillsSource.prompt()`` is the catalogue text to put in a system prompt.
"""

from __future__ import annotations

import os
import re
import reprlib
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from toolmesh.errors import ConfigError
from toolmesh.models import ToolDefinition
from toolmesh.sources.base import Source
from toolmesh.tools import Output, Tool, ToolContext

__all__ = ["Skill", "SkillsSource", "load_skills", "skills_catalogue", "skills_served_by"]

SKILL_FILE = "SKILL.md"
MAX_FILES = 200
MAX_FILE_BYTES = 256 * 1024
MAX_SKILL_BYTES = 1024 * 1024
MAX_DESCRIPTION_CHARS = 1024  # in the catalogue (the Agent Skills limit)
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(?:(.*?)\r?\n)?---[ \t]*(?:\r?\n|\Z)(.*)\Z", re.S)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill: what it is called, what it is for, where it lives and what it says."""

    name: str
    description: str
    path: Path
    instructions: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def summary(self) -> str:
        """The description as catalogues show it: on one line, at most
        ``MAX_DESCRIPTION_CHARS`` long."""
        return _one_line(self.description)

    def files(self) -> list[str]:
        """The skill folder's other files, relative to it (at most ``MAX_FILES``); a symlink
        that leads out of the folder is not listed, since the skill tool will not read it."""
        found: list[str] = []
        base = os.path.realpath(self.folder)
        for root, dirs, names in os.walk(self.folder):
            dirs.sort()  # which files make the cut must not depend on the file system's order
            for name in sorted(names):
                path = os.path.join(root, name)
                relative = os.path.relpath(path, self.folder)
                inside = _inside(base, os.path.realpath(path))
                if relative != SKILL_FILE and inside:
                    found.append(relative)
                if len(found) >= MAX_FILES:
                    return sorted(found)
        return sorted(found)


def load_skills(folder: str | Path) -> tuple[list[Skill], list[tuple[Path, str]]]:
    """Every skill under ``folder`` and, for each file (or folder link) that was skipped, why."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ConfigError(f"skills folder {root} does not exist or is not a folder")
    skills: list[Skill] = []
    names: dict[str, Path] = {}
    paths, problems = _skill_files(root)
    for path in paths:
        try:
            skill = _parse(path)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError, _yaml_error()) as exc:
            problems.append((path, _reason(exc)))
            continue
        if skill.name in names:
            problems.append(
                (path, f"skill name {skill.name!r} is already used by {names[skill.name]}")
            )
            continue
        names[skill.name] = path
        skills.append(skill)
    return skills, problems


def _skill_files(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Every ``SKILL.md`` under ``root``, and the folder links that were not followed.

    The walk stays inside its bounds: the skills folder, and each skill folder that a symlink
    outside it leads to. A link out of those bounds to a folder that is not a skill is not
    searched, lest ``evil -> /`` walk the whole disk and bring in (or shadow) skills from it."""
    bounds = [os.path.realpath(root)]
    seen: set[str] = set()
    found: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for current, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:
            dirs[:] = []  # reached again through a symlink: a loop
            continue
        seen.add(real)
        kept: list[str] = []
        for name in sorted(dirs):
            path = os.path.join(current, name)
            target = os.path.realpath(path)
            if any(_inside(bound, target) for bound in bounds):
                kept.append(name)
            elif os.path.isfile(os.path.join(target, SKILL_FILE)):
                bounds.append(target)  # a linked-in skill folder: it and what is inside it
                kept.append(name)
            else:
                reason = f"a link to {target}, outside the skills folder and not a skill folder"
                skipped.append((Path(path), f"{reason}; not searched"))
        dirs[:] = kept
        if SKILL_FILE in files:
            found.append(Path(current) / SKILL_FILE)
    return found, skipped


def _inside(base: str, path: str) -> bool:
    """Whether the real path ``path`` is ``base`` or under it."""
    return os.path.commonpath([base, path]) == base


def _parse(path: Path) -> Skill:
    import yaml

    text = _read_skill_file(path).decode("utf-8-sig")  # a leading BOM is not content
    text = text.replace("\r\n", "\n")  # CRLF files: no stray '\r' in the instructions
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise ValueError("no YAML front matter (the file must start with a '---' block)")
    front = yaml.safe_load(match.group(1) or "")
    if front is None:
        raise ValueError("the front matter is empty (it needs a 'name' and a 'description')")
    if not isinstance(front, dict):
        raise ValueError("the front matter is not a YAML mapping")
    name = _text_field(front, "name")
    if not _NAME.match(name):
        raise ValueError(f"name {name!r} must be letters, digits, '_', '.', '-' (at most 64)")
    description = _text_field(front, "description")
    metadata = {k: v for k, v in front.items() if k not in ("name", "description")}
    return Skill(name, description, path, match.group(2).strip(), metadata)


def _read_skill_file(path: Path) -> bytes:
    """The bytes of a regular file of at most ``MAX_SKILL_BYTES``; ``ValueError`` for anything
    else (a FIFO, a device such as ``/dev/zero``, a folder, a huge file), without blocking."""
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with _adopted(fd, lambda: _check_regular(fd)) as handle:
        info = os.fstat(handle.fileno())
        if info.st_size > MAX_SKILL_BYTES:
            raise ValueError(f"larger than {MAX_SKILL_BYTES} bytes ({info.st_size} bytes)")
        data = handle.read(MAX_SKILL_BYTES + 1)
    if len(data) > MAX_SKILL_BYTES:  # it grew after the check
        raise ValueError(f"larger than {MAX_SKILL_BYTES} bytes")
    return data


def _check_regular(fd: int) -> None:
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        raise ValueError(f"not a regular file ({_file_kind(mode)})")


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a plain file"


def _text_field(front: dict[Any, Any], key: str) -> str:
    """The front matter's ``key``: a non-empty string, or ``ValueError`` saying what it is."""
    if key not in front or front[key] is None:
        raise ValueError(f"the front matter has no {key!r}")
    value = front[key]
    if not isinstance(value, str):
        raise ValueError(
            f"the front matter's {key!r} must be a string, not {type(value).__name__} "
            f"({_short_repr(value)}; quote it)"
        )
    if not value.strip():
        raise ValueError(f"the front matter's {key!r} is empty")
    return value.strip()


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxset, _REPR.maxtuple = 2, 4, 4, 4, 4
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60


def _short_repr(value: Any) -> str:
    """A bounded repr: YAML aliases (``&a [*b, *b, ...]``) make a few bytes of front matter
    into a value whose full repr has billions of characters."""
    return _REPR.repr(value)


def _yaml_error() -> type[Exception]:
    import yaml

    error: type[Exception] = yaml.YAMLError
    return error


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _yaml_error()):
        return f"front matter is not valid YAML: {str(exc).splitlines()[0]}"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, RecursionError):
        return "the front matter is nested too deeply"
    return str(exc)


class SkillsSource(Source):
    """The skills of one folder, served through a ``skill`` tool."""

    def __init__(self, folder: str | Path, *, tool_name: str = "skill") -> None:
        self.folder = Path(folder)
        self.name = f"skills:{self.folder}"
        self.tool_name = tool_name
        self.skills: list[Skill] = []
        self.problems: list[tuple[Path, str]] = []
        self._tools: list[Tool] = []
        self.reload(notify=False)

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def reload(self, *, notify: bool = True) -> None:
        """Read the folder again (new, changed and removed skills)."""
        self.skills, self.problems = load_skills(self.folder)
        self._tools = [self._skill_tool()] if self.skills else []
        if notify:
            self.changed()

    def get(self, name: str) -> Skill | None:
        return next((s for s in self.skills if s.name == name), None)

    def prompt(self) -> str:
        """A catalogue of the skills for a system prompt."""
        return skills_catalogue(self.skills, self.tool_name)

    def _skill_tool(self) -> Tool:
        names = [s.name for s in self.skills]
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": names, "description": "The skill to load."},
                "file": {
                    "type": "string",
                    "description": "A file of the skill's folder to read instead.",
                },
            },
            "required": ["name"],
            "additionalProperties": False,
        }
        catalogue = "; ".join(f"{s.name}: {s.summary}" for s in self.skills)
        definition = ToolDefinition(
            name=self.tool_name,
            description=f"Load a skill's instructions (or one of its files). Skills: {catalogue}",
            idempotent=True,
            tags=["skills"],
        )
        return Tool(definition, self._run, source="skill", input_schema=schema)

    async def _run(self, arguments: dict[str, Any], ctx: ToolContext) -> Output:
        skill = self.get(arguments["name"])
        if skill is None:
            raise ValueError(f"no skill named {arguments['name']!r}")
        wanted = arguments.get("file")
        if wanted:
            return Output(
                {"skill": skill.name, "file": wanted}, text=_read_inside(skill.folder, wanted)
            )
        files = skill.files()
        listing = "\n".join(f"- {f}" for f in files)
        text = skill.instructions + (
            f"\n\nFiles in this skill's folder:\n{listing}" if files else ""
        )
        return Output(
            {"skill": skill.name, "description": skill.description, "files": files},
            text=text,
        )


def skills_catalogue(skills: Sequence[Skill], tool_name: str) -> str:
    """The catalogue of ``skills`` for a system prompt, loaded with the tool ``tool_name``
    (empty when there are none)."""
    if not skills:
        return ""
    lines = [f"- {s.name}: {s.summary}" for s in skills]
    return (
        f"Skills are available. Call the `{tool_name}` tool with a skill's name to load "
        "its instructions before following them.\n" + "\n".join(lines)
    )


def skills_served_by(tool: Tool) -> list[Skill] | None:
    """The skills ``tool`` can load when it is a ``SkillsSource``'s skill tool, under whatever
    name a toolkit serves it (prefixed, renamed, through a nested toolkit); None for any other
    tool. The skill tool's executor is its source's, whatever wraps the tool; and a skill is
    loadable when the tool's schema names it (a toolkit may serve a tool made before a reload)."""
    if tool.source != "skill":
        return None
    owner = getattr(tool._fn, "__self__", None)
    if not isinstance(owner, SkillsSource):
        return None
    names = tool.input_schema.get("properties", {}).get("name", {}).get("enum", ())
    return [skill for skill in owner.skills if skill.name in names]


def _one_line(text: str) -> str:
    """A description on one line: a YAML block (``description: |``) must not break the
    catalogue's one-skill-per-line list, nor pass off its lines as other skills. It is cut at
    ``MAX_DESCRIPTION_CHARS``: the catalogue goes into every request, and one skill's megabyte
    of description must not crowd out the conversation (the whole text stays in the skill)."""
    line = " ".join(text.split())
    if len(line) > MAX_DESCRIPTION_CHARS:
        line = line[: MAX_DESCRIPTION_CHARS - 1].rstrip() + "…"
    return line


def _read_inside(folder: Path, relative: str) -> str:
    if "\0" in relative:
        raise ValueError(f"{relative!r} is not a file name (it has a NUL character)")
    base = os.path.realpath(folder)
    target = os.path.realpath(os.path.join(base, relative))
    if not _inside(base, target):
        raise ValueError(f"{relative!r} is outside the skill's folder")
    # The checks above hold for the path as it was: a symlink swapped in before the open is not
    # followed (O_NOFOLLOW), one put in a parent's place is caught on the descriptor, and a FIFO
    # does not block the open (O_NONBLOCK).
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(target, flags)
    except OSError:
        raise ValueError(f"the skill has no file {relative!r}") from None
    with _adopted(fd, lambda: _check_opened(fd, base, relative)) as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{relative!r} is larger than {MAX_FILE_BYTES} bytes")
    return data.decode("utf-8", errors="replace")


def _check_opened(fd: int, base: str, relative: str) -> None:
    """``ValueError`` unless the open ``fd`` is a regular file inside ``base``."""
    proc = f"/proc/self/fd/{fd}"
    if os.path.exists(proc) and not _inside(base, os.readlink(proc)):
        raise ValueError(f"{relative!r} is outside the skill's folder")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        raise ValueError(f"the skill has no file {relative!r} ({_file_kind(mode)})")


def _adopted(fd: int, check: Callable[[], None]) -> BinaryIO:
    """``fd`` as a file object once ``check`` passed on the bare descriptor, which is closed
    when it does not: ``os.fdopen`` of a folder raises before any ``with`` owns the
    descriptor, so each refused folder used to leak one."""
    try:
        check()
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
