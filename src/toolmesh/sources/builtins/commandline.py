"""Reading a command line for the shell tool's allow-list mode, refusing what it does not know.

Why not a full shell parser: bashlex (the one Python port of bash's grammar) has had no release
since 2023 and has gaps; a parser that misreads one construct is a bypass. This tokenizer
accepts a small, exact subset of the shell language and refuses everything else with a message
naming the construct:

- words of plain characters, 'single-quoted' text, "double-quoted" text without ``$ ` \\ !``,
  and backslash-escaped characters;
- unquoted ``* ? [...]`` globs in arguments (expanded here, as bash would, before the checks);
- the operators ``|  &&  ||  ;`` and the redirections ``<  >  >>  2>  2>>  2>&1``, each only when
  the settings admit it (``operators``).

Refused always: ``$`` in any form (variables, ``$(...)``, ``$((...))``, ``$'...'``), backticks,
subshells and groups ``( ) { }``, background ``&``, here-documents and here-strings, process
substitution, comments, ``~`` and ``!``, newlines and other control characters, and environment
assignments before a program (``X=1 cmd``).

The checked command never reaches a shell as typed: a single command is executed directly
(argv, no shell); a command with operators is rebuilt from the checked words, each one quoted,
so the shell that runs it sees exactly the words that were checked.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from toolmesh.sources.builtins.base import Refused
from toolmesh.sources.builtins.confine import PathRefused, Roots

__all__ = [
    "LAUNCHERS",
    "OPERATORS",
    "TRAPS",
    "CommandRefused",
    "Plan",
    "Policy",
    "check_command",
    "parse_command",
]

OPERATORS = ("|", "&&", "||", ";", "<", ">", ">>")
MAX_EXPANSION = 10_000

# Programs that run another program named in their arguments. They are never in the default
# allow-list; naming one in `allow` admits it (and everything it can run).
LAUNCHERS = frozenset(
    [
        "env",
        "xargs",
        "sh",
        "bash",
        "dash",
        "zsh",
        "ksh",
        "csh",
        "tcsh",
        "fish",
        "busybox",
        "nohup",
        "nice",
        "ionice",
        "timeout",
        "time",
        "stdbuf",
        "setsid",
        "sudo",
        "su",
        "doas",
        "chroot",
        "unshare",
        "nsenter",
        "strace",
        "ltrace",
        "gdb",
        "watch",
        "flock",
        "taskset",
        "chrt",
        "script",
        "expect",
        "parallel",
        "exec",
        "eval",
        "command",
        "builtin",
        "source",
        "python",
        "python3",
        "perl",
        "ruby",
        "node",
        "php",
        "lua",
        "awk",
        "gawk",
        "mawk",
        "sed",
    ]
)

# Options through which an otherwise harmless program runs commands, writes files, or follows
# symlinks out of the workspace. Refused unless the allow-list admits them by name ("find -exec").
# A "--long" trap is also refused in any abbreviated form ("--compress-prog"): getopt_long and
# git accept every unambiguous prefix of a long option.
TRAPS: Mapping[str, tuple[str, ...]] = {
    "find": (
        "-L",
        "-follow",
        "-exec",
        "-execdir",
        "-ok",
        "-okdir",
        "-delete",
        "-fprint",
        "-fprint0",
        "-fprintf",
        "-fls",
        "-files0-from",  # starting points read from a file: unchecked paths
    ),
    "grep": ("-R", "--dereference-recursive"),
    # --files0-from: the names of the files to read come from a file, where no check sees them
    "sort": ("-o", "--output", "--compress-program", "--files0-from"),
    "wc": ("--files0-from",),
    "du": ("--files0-from", "-L", "--dereference"),
    "ls": ("-L", "--dereference"),
    "git": (
        "-c",
        "--config",  # clone: "--config core.fsmonitor=CMD" runs CMD, as "-c" does
        "--config-env",
        "--exec-path",
        "--upload-pack",
        "--receive-pack",
        "--output",
        "-O",
        "--open-files-in-pager",
        "--ext-diff",
        "--exec",
        "-x",
        "--template",  # clone/init: hooks from a folder of the caller's choosing run
        "config",
        "submodule",
        "bisect",
        "filter-branch",
        "difftool",
        "mergetool",
    ),
    "tar": (
        "--to-command",
        "--use-compress-program",
        "-I",
        "--checkpoint-action",
        "-F",
        "--info-script",
        "--new-volume-script",
    ),
    "rsync": ("-e", "--rsh", "--rsync-path"),
    "date": ("-s", "--set"),
    # -f/--files-from: the names of the files to examine come from a file, unchecked
    "file": ("-C", "--compile", "-f", "--files-from"),
    "less": ("-o", "--log-file"),
    "man": ("-P", "--pager", "-H", "--html"),
    "zip": ("-T", "--unzip-command", "-TT"),
}

# Options put right after the program: diff compares the files its folder arguments hold,
# following symlinks among them (out of the workspace) unless told not to.
PINNED: Mapping[str, tuple[str, ...]] = {"diff": ("--no-dereference",)}

# `date MMDDhhmm[[CC]YY][.ss]` sets the system clock, as `date -s` does.
_DATE_TO_SET = re.compile(r"\d{8}(?:\d{2}){0,2}(?:\.\d{2})?")

_SPECIAL = {
    "$": "'$' (variables, $(...) command substitution, $((...)) arithmetic) is not allowed",
    "`": "backticks (command substitution) are not allowed",
    "(": "subshells and '(' grouping are not allowed",
    ")": "subshells and ')' grouping are not allowed",
    "{": "'{' (brace expansion, command groups) is not allowed; quote it",
    "}": "'}' (brace expansion, command groups) is not allowed; quote it",
    "!": "'!' (history expansion, negation) is not allowed; quote it with single quotes",
}


class CommandRefused(Refused):
    """A command line the allow-list mode will not run; the message says why."""


@dataclass(slots=True)
class Word:
    text: str  # the word with quotes removed
    pattern: str | None = None  # a glob pattern when it has unquoted * ? [ (quoted parts escaped)


@dataclass(frozen=True, slots=True)
class Op:
    kind: str  # "op" (| && || ;) or "redir" (< > >> 2> 2>> 2>&1)
    value: str


@dataclass(slots=True)
class Command:
    words: list[Word] = field(default_factory=list)
    redirects: list[tuple[str, str]] = field(default_factory=list)  # (operator, target)


@dataclass(slots=True)
class Parsed:
    commands: list[Command]
    operators: list[str]  # between commands: |, &&, ||, ;


@dataclass(frozen=True, slots=True)
class Policy:
    """What the allow-list admits."""

    programs: Mapping[str, frozenset[str]]  # program -> admitted trap options
    operators: frozenset[str] = frozenset()
    confine_args: bool = True
    path: str = "/usr/local/bin:/usr/bin:/bin"

    @classmethod
    def from_allow(
        cls,
        allow: Sequence[str],
        operators: Sequence[str] = (),
        *,
        confine_args: bool = True,
        path: str = "/usr/local/bin:/usr/bin:/bin",
    ) -> Policy:
        programs: dict[str, set[str]] = {}
        for entry in allow:
            parts = entry.split()
            if not parts:
                raise ValueError("an empty entry in the shell allow-list")
            programs.setdefault(parts[0], set()).update(parts[1:])
        unknown = set(operators) - set(OPERATORS)
        if unknown:
            raise ValueError(
                f"unknown shell operators {sorted(unknown)}; known: {', '.join(OPERATORS)}"
            )
        return cls(
            {p: frozenset(t) for p, t in programs.items()},
            frozenset(operators),
            confine_args,
            path,
        )


@dataclass(slots=True)
class Plan:
    """A checked command: an argv to execute directly, or a quoted script for /bin/sh."""

    argv: list[str]
    script: str | None = None


# -- tokenizing ----------------------------------------------------------------------------------


def parse_command(line: str) -> Parsed:
    """Split a command line into commands, operators, words and redirections."""
    tokens = _tokenize(line)
    commands = [Command()]
    operators: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if isinstance(token, Word):
            commands[-1].words.append(token)
        elif token.kind == "op":
            if not commands[-1].words:
                raise CommandRefused(f"'{token.value}' without a command before it")
            operators.append(token.value)
            commands.append(Command())
        elif token.value == "2>&1":
            commands[-1].redirects.append((token.value, ""))
        else:
            target = tokens[i] if i < len(tokens) else None
            if not isinstance(target, Word):
                raise CommandRefused(f"redirection '{token.value}' has no file name after it")
            if target.pattern is not None:
                raise CommandRefused("a redirection target cannot be a glob")
            commands[-1].redirects.append((token.value, target.text))
            i += 1
    if not commands[-1].words:
        if operators:
            raise CommandRefused(f"'{operators[-1]}' without a command after it")
        raise CommandRefused("the command is empty")
    return Parsed(commands, operators)


def _tokenize(line: str) -> list[Word | Op]:
    tokens: list[Word | Op] = []
    text: list[str] = []
    pattern: list[str] = []
    globbed = False
    started = False  # inside a word (a quoted empty string counts)
    i, n = 0, len(line)

    def end_word() -> None:
        nonlocal globbed, started
        if started:
            tokens.append(Word("".join(text), "".join(pattern) if globbed else None))
        text.clear()
        pattern.clear()
        globbed = started = False

    def literal(chars: str) -> None:
        nonlocal started
        text.append(chars)
        pattern.append(glob.escape(chars))
        started = True

    while i < n:
        c = line[i]
        if c in " \t":
            end_word()
            i += 1
        elif c in "\n\r":
            raise CommandRefused("a newline in the command (a second command) is not allowed")
        elif not c.isprintable():
            raise CommandRefused(f"control character {c!r} in the command is not allowed")
        elif c == "'":
            close = line.find("'", i + 1)
            if close < 0:
                raise CommandRefused("an unterminated single quote")
            _check_quoted(line[i + 1 : close], single=True)
            literal(line[i + 1 : close])
            i = close + 1
        elif c == '"':
            close = line.find('"', i + 1)
            if close < 0:
                raise CommandRefused("an unterminated double quote")
            _check_quoted(line[i + 1 : close], single=False)
            literal(line[i + 1 : close])
            i = close + 1
        elif c == "\\":
            if i + 1 >= n or line[i + 1] in "\n\r":
                raise CommandRefused("a backslash at the end of the line (line continuation)")
            literal(line[i + 1])
            i += 2
        elif c in "*?[":
            text.append(c)
            pattern.append(c)
            globbed = started = True
            i += 1
        elif c in _SPECIAL:
            raise CommandRefused(_SPECIAL[c])
        elif c == "#" and not started:
            raise CommandRefused("comments ('#') are not allowed")
        elif c == "~" and not started:
            raise CommandRefused("'~' (home folder expansion) is not allowed; quote it")
        elif c in ";&|<>" or (c.isdigit() and not started and line[i + 1 : i + 2] == ">"):
            end_word()
            op, i = _operator(line, i)
            tokens.append(op)
        else:
            literal(c)
            i += 1
    end_word()
    return tokens


def _check_quoted(body: str, *, single: bool) -> None:
    if any(ch in "\n\r" for ch in body):
        raise CommandRefused("a newline inside quotes is not allowed")
    if any(not ch.isprintable() and ch != "\t" for ch in body):
        raise CommandRefused("a control character inside quotes is not allowed")
    if not single:
        for ch, what in (("$", "'$'"), ("`", "backticks"), ("\\", "backslashes"), ("!", "'!'")):
            if ch in body:
                raise CommandRefused(
                    f"{what} inside double quotes are not allowed; use single quotes"
                )


def _operator(line: str, i: int) -> tuple[Op, int]:
    rest = line[i:]
    for refused, why in (
        ("<<<", "here-strings ('<<<') are not allowed"),
        ("<<", "here-documents ('<<') are not allowed"),
        ("<(", "process substitution ('<(...)') is not allowed"),
        (">(", "process substitution ('>(...)') is not allowed"),
        ("<>", "'<>' redirections are not allowed"),
        ("<&", "'<&' descriptor duplication is not allowed"),
        ("&>", "'&>' redirections are not allowed; use '>' and '2>&1'"),
        (">|", "'>|' redirections are not allowed"),
        ("|&", "'|&' is not allowed; use '2>&1 |'"),
        (";;", "';;' is not allowed"),
    ):
        if rest.startswith(refused):
            raise CommandRefused(why)
    for op in ("2>&1", "2>>", "2>", ">>", ">&", "&&", "||", ">", "<", "|", ";", "&"):
        if rest.startswith(op):
            if op == ">&":
                raise CommandRefused("'>&' descriptor duplication is not allowed (only 2>&1)")
            if op == "&":
                raise CommandRefused("background jobs ('&') are not allowed")
            kind = "redir" if op[-1] in "<>" or op == "2>&1" else "op"
            return Op(kind, op), i + len(op)
    if line[i].isdigit():
        raise CommandRefused(f"redirecting descriptor {line[i]} is not allowed (only 2>)")
    raise CommandRefused(f"{line[i]!r} is not allowed")  # pragma: no cover - all cases above


# -- checking ------------------------------------------------------------------------------------


def check_command(line: str, policy: Policy, roots: Roots, cwd: str) -> Plan:
    """The plan to run ``line`` if the policy admits every part of it, else ``CommandRefused``."""
    parsed = parse_command(line)
    for op in parsed.operators:
        if op not in policy.operators:
            raise CommandRefused(_operator_refusal(op))
    argvs: list[list[str]] = []
    redirects: list[list[tuple[str, str]]] = []
    for command in parsed.commands:
        argv = _expand(command.words, cwd, roots if policy.confine_args else None)
        argv[0] = _program(argv[0], command.words[0], policy)
        program = os.path.basename(argv[0])
        _check_traps(program, argv[1:], policy)
        _check_operands(program, argv[1:], policy)
        argv[1:1] = PINNED.get(program, ())
        if policy.confine_args:
            for arg in argv[1:]:
                _confine_arg(arg, roots, cwd)
        argvs.append(argv)
        redirects.append(_redirects(command.redirects, policy, roots, cwd))
    if len(argvs) == 1 and not redirects[0]:
        return Plan(argvs[0])
    parts: list[str] = []
    for index, (argv, redirs) in enumerate(zip(argvs, redirects, strict=True)):
        words = [shlex.quote(a) for a in argv]
        for op, target in redirs:
            words.append(op if op == "2>&1" else f"{op} {shlex.quote(target)}")
        parts.append(" ".join(words))
        if index < len(parsed.operators):
            parts.append(parsed.operators[index])
    script = " ".join(parts)
    return Plan(["/bin/sh", "-c", script], script)


_OPERATOR_NAMES = {
    "|": "pipes ('|') are",
    "&&": "chaining with '&&' is",
    "||": "chaining with '||' is",
    ";": "chaining with ';' is",
}


def _operator_refusal(op: str) -> str:
    return (
        f"{_OPERATOR_NAMES[op]} not allowed by the shell allow-list (admit '{op}' in `operators`)"
    )


def _expand(words: list[Word], cwd: str, roots: Roots | None = None) -> list[str]:
    """The argv the words make, globs expanded. With ``roots``, every path a glob expands to
    must lie inside them; a refusal names the pattern, not the match, so that a glob cannot
    list a folder outside the workspace through the error message."""
    argv: list[str] = []
    first = words[0]
    if first.pattern is not None:
        raise CommandRefused("a glob in the program name is not allowed")
    for word in words:
        if word.pattern is None:
            argv.append(word.text)
            continue
        found = sorted(glob.glob(word.pattern, root_dir=cwd))
        if roots is not None:  # matched or not, one answer: no hint of what lies outside
            for match in found or [word.text]:
                try:
                    roots.resolve(match, base=cwd)
                except PathRefused:
                    raise CommandRefused(
                        f"the glob {word.text!r} reaches outside the workspace"
                    ) from None
        if len(argv) + len(found) > MAX_EXPANSION:
            raise CommandRefused(f"the glob {word.text!r} matches too many files")
        argv.extend(found or [word.text])
    return argv


def _program(name: str, word: Word, policy: Policy) -> str:
    if "=" in name:
        raise CommandRefused(f"environment assignments before a program ({name!r}) are not allowed")
    if name not in policy.programs:
        allowed = ", ".join(sorted(policy.programs)) or "none"
        why = " (it runs other programs)" if name in LAUNCHERS else ""
        raise CommandRefused(
            f"program {name!r} is not in the shell allow-list{why}; allowed: {allowed}"
        )
    if "/" in name:
        return name  # an explicit path the allow-list names exactly
    found = shutil.which(name, path=policy.path)
    if found is None:
        raise CommandRefused(f"program {name!r} is allowed but not found on {policy.path}")
    return found


def _check_traps(program: str, args: list[str], policy: Policy) -> None:
    admitted = policy.programs.get(program, frozenset())
    traps = [trap for trap in TRAPS.get(program, ()) if trap not in admitted]
    for arg in args:
        if arg.startswith("--") and arg.partition("=")[0] in admitted:
            continue  # an admitted long option spelled out exactly: getopt prefers exact names
        for trap in traps:
            if _is_trap(arg, trap):
                raise CommandRefused(
                    f"'{program} {trap}' can run other programs, write files or leave the "
                    f"workspace; {arg!r} is refused unless the allow-list admits it "
                    f'("{program} {trap}")'
                )


def _check_operands(program: str, args: list[str], policy: Policy) -> None:
    """Refuse operands that make a program change the system (admitted like traps) or write a
    file (``uniq IN OUT``: the default list is meant to read)."""
    if program == "uniq" and len(_uniq_operands(args)) > 1:
        raise CommandRefused(
            "'uniq INPUT OUTPUT' writes OUTPUT; give one input and read what uniq prints"
        )
    if program == "git" and "-u" not in policy.programs.get(program, frozenset()):
        _refuse_clone_upload_pack(args)
    if program != "date" or "-s" in policy.programs.get(program, frozenset()):
        return
    for arg in args:
        if _DATE_TO_SET.fullmatch(arg):
            raise CommandRefused(
                f"'date {arg}' sets the system clock; it is refused unless the allow-list "
                'admits it ("date -s")'
            )


_UNIQ_VALUED = frozenset({"-f", "-s", "-w", "--skip-fields", "--skip-chars", "--check-chars"})


def _uniq_operands(args: list[str]) -> list[str]:
    """uniq's file operands: its arguments without options (and the values they take)."""
    operands: list[str] = []
    options_end = takes_value = False
    for arg in args:
        if takes_value:
            takes_value = False
        elif not options_end and arg == "--":
            options_end = True
        elif not options_end and arg.startswith("-") and arg != "-":
            takes_value = arg in _UNIQ_VALUED
        else:
            operands.append(arg)
    return operands


def _refuse_clone_upload_pack(args: list[str]) -> None:
    """``git clone -u CMD`` runs CMD (``-u`` is short for ``--upload-pack`` there, and only
    there: ``git add -u`` and ``git push -u`` are harmless, so it is no trap of all of git)."""
    subcommand, after_c = "", False
    for arg in args:
        if after_c:  # the folder of "-C FOLDER", which comes before the subcommand
            after_c = False
        elif arg == "-C":
            after_c = True
        elif not arg.startswith("-"):
            subcommand = arg
            break
    if subcommand != "clone":
        return
    for arg in args:
        if arg.startswith("-") and not arg.startswith("--") and "u" in arg[1:]:
            raise CommandRefused(
                f"'git clone -u' runs the program it names; {arg!r} is refused unless the "
                'allow-list admits it ("git -u")'
            )


def _is_trap(arg: str, trap: str) -> bool:
    if arg == trap or arg.startswith(trap + "="):
        return True
    if trap.startswith("--"):
        # any abbreviation, even an ambiguous one: "--to-com=sh" is "--to-command=sh"
        name = arg.partition("=")[0]
        return len(name) > 2 and name.startswith("--") and trap.startswith(name)
    if len(trap) == 2 and trap[0] == "-":
        # a short option, also inside a cluster (-no) or with its value glued on (-ofile)
        return arg.startswith("-") and not arg.startswith("--") and trap[1] in arg[1:]
    return False


def _confine_arg(arg: str, roots: Roots, cwd: str) -> None:
    # The argument as a whole is always a candidate, even when it looks like an option: after
    # "--" (or as an option's separate value, "grep -f -x") "-x" is a file name.
    candidates = [arg]
    if arg.startswith("--"):
        _name, eq, value = arg.partition("=")
        if eq:
            candidates.append(value)
    elif arg.startswith("-"):
        # a short-option cluster: any letter may take the rest as its value ("-bf/etc/x" is
        # -b -f /etc/x), so every tail after the first option letter is a possible path
        candidates += [arg[i:] for i in range(2, len(arg))]  # "-x=v": "v" is one of them
    for candidate in candidates:
        if not candidate:
            continue
        path = os.path.join(cwd, candidate)
        if "/" in candidate or os.path.lexists(path):
            try:
                real = roots.resolve(candidate, base=cwd)
            except PathRefused as exc:
                raise CommandRefused(
                    f"argument {arg!r} names a path outside the workspace ({exc})"
                ) from None
            _refuse_hard_link(arg, real, roots)


def _refuse_hard_link(arg: str, real: str, roots: Roots) -> None:
    """A file with more than one hard link may be another name of a file outside the
    workspace; refused as the file tools refuse it (unless ``allow_hardlinks``)."""
    if roots.allow_hardlinks:
        return
    try:
        info = os.lstat(real)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise CommandRefused(
            f"argument {arg!r} names a file with {info.st_nlink} hard links; it is refused "
            "because another link may lie outside the workspace"
        )


def _redirects(
    redirects: list[tuple[str, str]], policy: Policy, roots: Roots, cwd: str
) -> list[tuple[str, str]]:
    checked: list[tuple[str, str]] = []
    for op, target in redirects:
        if op == "2>&1":
            checked.append((op, target))
            continue
        kind = op.removeprefix("2")
        if kind not in policy.operators:
            raise CommandRefused(
                f"redirection '{op}' is not allowed by the shell allow-list (admit '{kind}' in "
                "`operators`)"
            )
        try:
            real = roots.resolve(target, base=cwd)
            roots.check_file(real)
        except PathRefused as exc:
            raise CommandRefused(f"redirection target {target!r} is refused: {exc}") from None
        checked.append((op, real))
    return checked
