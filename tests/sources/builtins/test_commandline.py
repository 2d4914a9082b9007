"""The shell allow-list: the bypass corpus, each form refused before anything runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.sources.builtins.conftest import SECRET, Make
from toolmesh import ToolErrorCode
from toolmesh.sources.builtins.commandline import CommandRefused, Policy, check_command
from toolmesh.sources.builtins.confine import Roots

ALLOW = ["ls", "echo", "cat", "find", "grep", "sort"]

BYPASSES = [
    ("semicolon", "echo ok; rm victim", "chaining with ';'"),
    ("and", "echo ok && rm victim", "chaining with '&&'"),
    ("or", "echo ok || rm victim", "chaining with '||'"),
    ("pipe", "echo rm victim | sh", "pipes"),
    ("pipe stderr", "echo ok |& sh", "'|&'"),
    ("dollar paren", "echo $(rm victim)", "command substitution"),
    ("dollar paren quoted", 'echo "$(rm victim)"', "inside double quotes"),
    ("backticks", "echo `rm victim`", "backticks"),
    ("backticks quoted", 'echo "`rm victim`"', "inside double quotes"),
    ("arithmetic", "echo $((1+1))", "'$'"),
    ("variable", "cat $HOME/.bashrc", "'$'"),
    ("braced variable", "echo ${PATH}", "'$'"),
    ("ansi-c string", "echo $'\\x41'", "'$'"),
    ("redirect out", "echo pwned > victim", "redirection '>'"),
    ("redirect append", "echo pwned >> victim", "redirection '>>'"),
    ("redirect in", "cat < victim", "redirection '<'"),
    ("redirect stderr", "ls 2> victim", "redirection '2>'"),
    ("redirect both", "echo pwned &> victim", "'&>'"),
    ("clobber", "echo pwned >| victim", "'>|'"),
    ("descriptor", "echo pwned 1> victim", "descriptor 1"),
    ("here-string", "cat <<< pwned", "here-strings"),
    ("here-document", "cat << EOF", "here-documents"),
    ("process substitution", "cat <(rm victim)", "process substitution"),
    ("subshell", "(rm victim)", "subshells"),
    ("group", "{ rm victim; }", "'{'"),
    ("background", "echo ok & rm victim", "background"),
    ("sh -c", "sh -c 'rm victim'", "program 'sh' is not in the shell allow-list"),
    ("bash -c", "bash -c 'rm victim'", "program 'bash'"),
    ("env", "env X=1 sh -c 'rm victim'", "program 'env'"),
    ("assignment", "X=1 sh", "environment assignments"),
    ("xargs", "xargs rm", "program 'xargs'"),
    ("find -exec", "find . -exec rm '{}' ';'", "'find -exec'"),
    ("find -execdir", "find . -execdir rm '{}' +", "'find -execdir'"),
    ("find -delete", "find . -name victim -delete", "'find -delete'"),
    ("sort compress", "sort --compress-program=sh victim", "'sort --compress-program'"),
    ("sort output", "sort -uo victim victim", "'sort -o'"),
    # getopt_long takes any unambiguous prefix of a long option
    ("sort compress abbreviated", "sort --compress-prog=sh -S 1 victim", "'--compress-prog=sh'"),
    ("sort compress shortest", "sort --compress sh victim", "'sort --compress-program'"),
    ("sort output abbreviated", "sort --out=victim victim", "'sort --output'"),
    # following symlinks out of the workspace
    ("grep -R", "grep -R alive .", "'grep -R'"),
    ("grep -R in a cluster", "grep -nR alive .", "'grep -R'"),
    ("grep --dereference", "grep --dereference-rec alive .", "'grep --dereference-recursive'"),
    ("find -L", "find -L . -name victim", "'find -L'"),
    ("find -follow", "find . -follow -name victim", "'find -follow'"),
    ("newline", "echo ok\nrm victim", "newline"),
    ("carriage return", "echo ok\rrm victim", "newline"),
    ("NUL", "echo ok\x00rm victim", "control character"),
    ("line continuation", "echo ok \\", "backslash at the end"),
    ("glob program", "/???/r? victim", "program"),
    ("glob program name", "r? victim", "glob in the program name"),
    ("path to a disallowed program", "/bin/rm victim", "program '/bin/rm'"),
    ("path alias of an allowed program", "/bin/ls", "program '/bin/ls'"),
    ("relative alias of an allowed program", "./ls", "program './ls'"),
    ("escaped letters", "r\\m victim", "program 'rm'"),
    ("quoted program", "'rm' victim", "program 'rm'"),
    ("exec builtin", "exec rm victim", "program 'exec'"),
    ("command builtin", "command rm victim", "program 'command'"),
    ("nohup", "nohup rm victim", "program 'nohup'"),
    ("busybox", "busybox rm victim", "program 'busybox'"),
    ("comment", "ls # rm victim", "comments"),
    ("tilde", "cat ~/.bashrc", "'~'"),
    ("history", "echo !!", "'!'"),
    ("absolute path argument", "cat /etc/passwd", "outside the workspace"),
    ("dotdot argument", "cat ../outside/secret.txt", "outside the workspace"),
    ("glued option path", "grep -f/etc/passwd victim", "outside the workspace"),
    ("path glued inside a cluster", "grep -hf/etc/passwd victim", "outside the workspace"),
    ("relative path inside a cluster", "grep -hf../outside/secret.txt victim", "outside"),
    ("option value path", "ls --hide=x --ignore=/etc", "outside the workspace"),
    ("symlinked argument", "cat escape", "outside the workspace"),
    ("unterminated quote", "echo 'rm victim", "unterminated"),
    ("empty", "   ", "empty"),
    ("trailing operator", "echo ok;", "without a command after it"),
]


@pytest.fixture
def victim(workspace: Path, outside: Path) -> Path:
    (workspace / "victim").write_text("alive\n")
    os.symlink(outside / "secret.txt", workspace / "escape")
    return workspace / "victim"


async def assert_refused(kit: Any, commands: tuple[str, ...], *, leaking: str = "") -> None:
    """Each command is refused (tool_denied), and its answer shows nothing of ``leaking``."""
    for command in commands:
        result = await kit.execute("shell", {"command": command})
        assert result.error_code == ToolErrorCode.TOOL_DENIED, (command, result)
        if leaking:
            assert leaking not in (result.output or ""), command


@pytest.mark.parametrize(("label", "command", "reason"), BYPASSES, ids=[b[0] for b in BYPASSES])
async def test_bypasses_are_refused(
    make_kit: Make, victim: Path, label: str, command: str, reason: str
) -> None:
    kit = await make_kit({"shell": {"allow": ALLOW}})
    result = await kit.execute("shell", {"command": command})
    assert result.error_code == ToolErrorCode.TOOL_DENIED, (label, result)
    assert reason in (result.error or ""), result.error
    assert victim.read_text() == "alive\n"


def test_the_corpus_is_large_enough() -> None:
    assert len(BYPASSES) >= 25


async def test_what_the_allow_list_admits_runs(make_kit: Make, workspace: Path) -> None:
    (workspace / "a file.txt").write_text("one\ntwo\n")
    (workspace / "b.txt").write_text("three\n")
    kit = await make_kit({"shell": {"allow": ALLOW}})
    for command, expected in [
        ("echo hello   world", "hello world\n"),
        ("cat 'a file.txt'", "one\ntwo\n"),
        ('cat "a file.txt"', "one\ntwo\n"),
        ("cat a\\ file.txt", "one\ntwo\n"),
        ("ls *.txt", "a file.txt\nb.txt\n"),
        ("echo '*.txt'", "*.txt\n"),
        ("find . -name 'b.*'", "./b.txt\n"),
        ("grep -c o 'a file.txt'", "2\n"),
        ("echo 'a;b && $(c)'", "a;b && $(c)\n"),
    ]:
        result = await kit.execute("shell", {"command": command})
        assert result.success and result.data["stdout"] == expected, (command, result)


async def test_operators_when_admitted(make_kit: Make, workspace: Path) -> None:
    shell = {"allow": ["echo", "grep", "cat"], "operators": ["|", "&&", ">"]}
    kit = await make_kit({"shell": shell})
    piped = await kit.execute("shell", {"command": "echo hello | grep ell && echo done"})
    assert piped.data["stdout"] == "hello\ndone\n"
    written = await kit.execute("shell", {"command": "echo saved > out.txt"})
    assert written.success and (workspace / "out.txt").read_text() == "saved\n"
    outside = await kit.execute("shell", {"command": "echo x > ../x.txt"})
    assert outside.error_code == ToolErrorCode.TOOL_DENIED
    chained = await kit.execute("shell", {"command": "echo a; echo b"})
    assert chained.error_code == ToolErrorCode.TOOL_DENIED
    appended = await kit.execute("shell", {"command": "echo x >> out.txt"})
    assert "admit '>>'" in appended.error


async def test_traps_when_admitted(make_kit: Make, workspace: Path) -> None:
    (workspace / "x.txt").write_text("")
    kit = await make_kit({"shell": {"allow": ["find -exec", "echo"]}})
    result = await kit.execute("shell", {"command": "find . -name x.txt -exec echo found '{}' ';'"})
    assert result.data["stdout"] == "found ./x.txt\n", result


def test_rebuilt_scripts_quote_every_word(workspace: Path) -> None:
    policy = Policy.from_allow(["echo", "cat"], ["|"])
    plan = check_command("echo 'a b' '$(x)' | cat", policy, Roots([workspace]), str(workspace))
    assert plan.script == "/usr/bin/echo 'a b' '$(x)' | /usr/bin/cat"


def test_bad_allow_lists() -> None:
    with pytest.raises(ValueError, match="unknown shell operators"):
        Policy.from_allow(["ls"], ["&"])
    with pytest.raises(ValueError, match="empty entry"):
        Policy.from_allow([" "])


def test_refusals_are_value_errors(workspace: Path) -> None:
    policy = Policy.from_allow(["ls"])
    with pytest.raises(CommandRefused, match="not in the shell allow-list; allowed: ls"):
        check_command("rm x", policy, Roots([workspace]), str(workspace))


@pytest.mark.parametrize(
    ("command", "trap"),
    [
        ("tar --to-com=sh -xf p.tar", "tar --to-command"),
        ("tar --use-compress-prog=sh -xf p.tar", "tar --use-compress-program"),
        # a value date cannot parse: were the refusal ever to fail, the clock stays as it is
        ("date --se=not-a-date", "date --set"),
        ("file --comp x", "file --compile"),
        ("git --exec-pa=x log", "git --exec-path"),
        ("git log --ext-dif", "git --ext-diff"),
        ("git --upload-p=sh ls-remote x", "git --upload-pack"),
        ("git clone --templ=hooks x y", "git --template"),
        ("git init --template=hooks", "git --template"),
        ("git clone --config=core.fsmonitor=sh x y", "git --config"),
    ],
)
async def test_abbreviated_trap_options_are_refused(
    make_kit: Make, victim: Path, command: str, trap: str
) -> None:
    kit = await make_kit({"shell": {"allow": ["tar", "date", "file", "git"]}})
    result = await kit.execute("shell", {"command": command})
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    abbreviated = next(word for word in command.split() if word.startswith("--"))
    assert f"'{trap}'" in result.error and repr(abbreviated) in result.error


def test_git_clone_u_is_refused_and_other_git_u_is_not(workspace: Path) -> None:
    policy, roots = Policy.from_allow(["git"]), Roots([workspace])
    for line in ("git clone -u sh x y", "git clone -qu sh x y", "git -C . clone x y -u sh"):
        with pytest.raises(CommandRefused, match="'git clone -u' runs the program it names"):
            check_command(line, policy, roots, str(workspace))
    for line in ("git add -u", "git push -u origin main", "git status -uno"):
        assert check_command(line, policy, roots, str(workspace)).argv[0].endswith("git")
    admitted = Policy.from_allow(["git -u"])
    assert check_command("git clone -u sh x y", admitted, roots, str(workspace))


async def test_an_abbreviated_compress_program_does_not_run(make_kit: Make, tmp_path: Path) -> None:
    marker = tmp_path / "pwned.txt"
    kit = await make_kit()  # the default allow-list
    await kit.execute("write_file", {"path": "cmds.txt", "content": f"touch {marker}\n" * 5000})
    result = await kit.execute("shell", {"command": "sort --compress-prog=sh -S 1 cmds.txt"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED and "--compress-prog" in result.error
    assert not marker.exists()


async def test_admitted_traps_work_as_before(make_kit: Make, workspace: Path) -> None:
    (workspace / "x.txt").write_text("b\na\n")
    kit = await make_kit({"shell": {"allow": ["sort --compress-program", "grep -R"]}})
    for command, expected in [
        ("sort --compress-program=gzip x.txt", "a\nb\n"),
        ("sort --compress-prog=gzip x.txt", "a\nb\n"),  # only the admitted option has it
        ("grep -Rh a .", "a\n"),
    ]:
        result = await kit.execute("shell", {"command": command})
        assert result.success and result.data["stdout"] == expected, (command, result)
    output = await kit.execute("shell", {"command": "sort --out=y.txt x.txt"})
    assert output.error_code == ToolErrorCode.TOOL_DENIED  # --output is still a trap


def test_an_admitted_exact_name_wins_over_a_longer_trap(workspace: Path) -> None:
    # "--exec" is itself a prefix of the trap "--exec-path"; spelled out it means "--exec"
    policy = Policy.from_allow(["git --exec"])
    roots = Roots([workspace])
    assert check_command("git rebase --exec true", policy, roots, str(workspace)).argv[-1] == "true"
    with pytest.raises(CommandRefused, match="'git --exec-path'"):
        check_command("git rebase --exec-p=x", policy, roots, str(workspace))


async def test_symlink_following_options_do_not_leave_the_workspace(
    make_kit: Make, workspace: Path, outside: Path
) -> None:
    os.symlink(outside, workspace / "link_out")
    (workspace / "mine.txt").write_text("secret of mine\n")
    kit = await make_kit()  # the default allow-list
    recursive = await kit.execute("shell", {"command": "grep -r secret ."})
    assert recursive.success and recursive.data["stdout"] == "./mine.txt:secret of mine\n"
    await assert_refused(
        kit, ("grep -R secret .", "grep -Rn secret .", "find -L . -name secret.txt")
    )


async def test_file_name_lists_cannot_name_files_outside(
    make_kit: Make, workspace: Path, outside: Path
) -> None:
    # --files0-from reads the names to open from a file, which no argument check sees
    (workspace / "names").write_text(f"{outside / 'secret.txt'}\0")
    kit = await make_kit()  # the default allow-list
    await assert_refused(
        kit,
        (
            "sort --files0-from=names",
            "sort --files0 names",
            "wc --files0-from=names",
            "du --files0-from=names",
            "find -files0-from names",
        ),
        leaking="secret",
    )


async def test_listing_programs_do_not_follow_symlinks_out(
    make_kit: Make, workspace: Path, outside: Path
) -> None:
    (workspace / "mine").mkdir()
    (workspace / "theirs").mkdir()
    os.symlink(outside / "secret.txt", workspace / "mine" / "notes")
    (workspace / "theirs" / "notes").write_text("mine\n")
    os.symlink(outside, workspace / "link_out")
    kit = await make_kit()
    for command in ("diff mine theirs", "diff -r . theirs", "diff -u mine/../mine theirs"):
        result = await kit.execute("shell", {"command": command})
        assert SECRET.strip() not in (result.output or ""), (command, result)
    await assert_refused(kit, ("ls -RL .", "ls --dereference link_out/..", "du -aL ."))


def test_date_cannot_set_the_clock(workspace: Path) -> None:
    # only checked, never run: `date MMDDhhmm` sets the clock when toolmesh may
    roots = Roots([workspace])
    policy = Policy.from_allow(["date"])
    for command in ("date 01010000", "date -u 0101000030", "date -- 010100002030.59"):
        with pytest.raises(CommandRefused, match="sets the system clock"):
            check_command(command, policy, roots, str(workspace))
    for command in ("date +%s", "date -d 2020-01-01 +%F", "date -u"):
        assert check_command(command, policy, roots, str(workspace)).argv[0].endswith("date")


def test_diff_is_pinned_to_not_dereference(workspace: Path) -> None:
    plan = check_command("diff a b", Policy.from_allow(["diff"]), Roots([workspace]), ".")
    assert plan.argv[1:] == ["--no-dereference", "a", "b"]


def test_uniq_cannot_write_its_output_file(workspace: Path) -> None:
    (workspace / "in.txt").write_text("a\na\n")
    roots, policy = Roots([workspace]), Policy.from_allow(["uniq"])
    for command in ("uniq in.txt out.txt", "uniq -c in.txt out.txt", "uniq -- in.txt out.txt"):
        with pytest.raises(CommandRefused, match="writes OUTPUT"):
            check_command(command, policy, roots, str(workspace))
    for command in ("uniq in.txt", "uniq -f 1 in.txt", "uniq -w 3 -c in.txt", "uniq -"):
        assert check_command(command, policy, roots, str(workspace)).argv[0].endswith("uniq")


async def test_operands_that_look_like_options_are_confined(
    make_kit: Make, workspace: Path, outside: Path
) -> None:
    # after "--", or as an option's separate value, "-x" is a file name: a symlink so named
    # (a cloned repository may hold one) must not lead out of the workspace
    os.symlink(outside / "secret.txt", workspace / "-x")
    os.symlink(outside / "secret.txt", workspace / "--y")
    (workspace / "mine.txt").write_text("mine\n")
    kit = await make_kit()  # the default allow-list
    await assert_refused(
        kit,
        ("cat -- -x", "cat -- --y", "head -- -x", "grep -f -x mine.txt", "cat -- *"),
        leaking=SECRET.strip(),
    )
    plain = await kit.execute("shell", {"command": "cat -- mine.txt"})
    assert plain.success and plain.data["stdout"] == "mine\n"
    assert (await kit.execute("shell", {"command": "echo -n --y=1"})).success


async def test_hard_linked_arguments_are_refused_like_the_file_tools_refuse_them(
    make_kit: Make, workspace: Path, outside: Path
) -> None:
    os.link(outside / "secret.txt", workspace / "alias.txt")
    kit = await make_kit()
    result = await kit.execute("shell", {"command": "cat alias.txt"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert "hard links" in (result.error or "") and SECRET.strip() not in (result.output or "")
    allowed = await make_kit({"allow_hardlinks": True})
    assert (await allowed.execute("shell", {"command": "cat alias.txt"})).success


async def test_file_cannot_read_its_names_from_a_file(
    make_kit: Make, workspace: Path, outside: Path
) -> None:
    (workspace / "names").write_text(f"{outside / 'secret.txt'}\n")
    kit = await make_kit()
    await assert_refused(
        kit,
        (
            "file -f names",
            "file -bf names",
            "file --files-from names",
            "file --files=names",
        ),
        leaking="secret.txt",
    )


def test_a_glob_outside_the_workspace_does_not_list_it(workspace: Path, outside: Path) -> None:
    # the refusal named the first match: a listing of any folder, one pattern at a time
    (outside / "id_hidden_key").write_text("x")
    roots, policy = Roots([workspace]), Policy.from_allow(["echo", "ls"])
    answers = set()
    for command in (f"echo {outside}/id_*", f"echo {outside}/zz*", "ls ../outside/*"):
        with pytest.raises(CommandRefused) as refused:
            check_command(command, policy, roots, str(workspace))
        assert "id_hidden_key" not in str(refused.value) and "secret.txt" not in str(refused.value)
        answers.add(str(refused.value).replace(command.split(" ", 1)[1], "PATTERN"))
    assert len(answers) == 1, answers  # a match and no match answer alike
    (workspace / "in.txt").write_text("x")
    assert check_command("ls i*", policy, roots, str(workspace)).argv[1:] == ["in.txt"]


def test_absolute_arguments_through_a_symlinked_workspace_are_inside(
    workspace: Path, outside: Path
) -> None:
    # the shell's argument checks refused them as outside the workspace, as the file tools did
    (workspace / "a.txt").write_text("inside\n")
    os.symlink(outside, workspace / "out")
    link = workspace.parent / "ws-link"
    os.symlink(workspace, link)
    roots, policy = Roots([link]), Policy.from_allow(["cat", "ls"])
    cwd = roots.home
    assert check_command(f"cat {link}/a.txt", policy, roots, cwd).argv[1:] == [f"{link}/a.txt"]
    assert check_command(f"ls {link}/*.txt", policy, roots, cwd).argv[1:] == [f"{link}/a.txt"]
    for command in (f"cat {link}/out/secret.txt", f"cat {link}/../outside/secret.txt"):
        with pytest.raises(CommandRefused, match="outside the workspace"):
            check_command(command, policy, roots, cwd)
