"""The shell tool (capability shell::exec), and the ``bash`` kind of toolmesh.toml.

Two modes, chosen by ``allow``:

- a list of programs (the default is a short list of read-only ones): the command line is
  checked by commandline.py and runs without a shell unless it uses admitted operators;
- ``"*"``: any command, run by ``bash -c``; pair it with ``isolation = "bubblewrap"``.

Either mode runs within the process limits of process.py (deadline, output bound, environment,
resources) in the working folder, and inside bubblewrap when ``isolation`` says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolmesh.errors import ConfigError
from toolmesh.models import ToolErrorCode, ToolResult
from toolmesh.sources.base import Source, ToolSet
from toolmesh.sources.builtins.base import denied, make_tool, schema
from toolmesh.sources.builtins.commandline import Policy, check_command
from toolmesh.sources.builtins.confine import PathRefused, Roots
from toolmesh.sources.builtins.process import Completed, ProcessSettings, build_env, run_process
from toolmesh.sources.builtins.sandbox import HELPER_PROCESSES, Sandbox, SandboxUnavailable
from toolmesh.sources.builtins.settings import load
from toolmesh.tools import Tool, ToolContext

__all__ = [
    "DEFAULT_ALLOW",
    "ShellSettings",
    "run_limited",
    "shape_completed",
    "shell_tool",
    "sources_from_manifest",
    "working_folder",
]

EXEC = "shell::exec"
DEFAULT_ALLOW = (
    "ls",
    "cat",
    "head",
    "tail",
    "wc",
    "grep",
    "sort",
    "uniq",
    "cut",
    "tr",
    "diff",
    "cmp",
    "file",
    "stat",
    "du",
    "pwd",
    "echo",
    "true",
    "false",
    "date",
    "basename",
    "dirname",
    "realpath",
    "find",
)


@dataclass(frozen=True, slots=True)
class ShellSettings(ProcessSettings):
    """The shell tool: its mode (``allow``) and its process limits."""

    allow: tuple[str, ...] | Literal["*"] = DEFAULT_ALLOW
    operators: tuple[str, ...] = ()  # admitted in allow-list mode: | && || ; < > >>
    confine_args: bool = True  # allow-list mode: path arguments must stay in the workspace
    shell: str = "/bin/bash"  # runs the command when allow = "*"
    capabilities: tuple[str, ...] | None = None  # None: shell::exec

    def policy(self) -> Policy | None:
        if self.allow == "*":
            return None
        return Policy.from_allow(
            self.allow, self.operators, confine_args=self.confine_args, path=self.path
        )


def working_folder(roots: Roots, settings: ProcessSettings) -> str:
    """The resolved working folder (settings.cwd inside the workspace)."""
    try:
        cwd = roots.resolve(settings.cwd)
    except PathRefused as exc:
        raise ConfigError(f"working folder {settings.cwd!r}: {exc}") from None
    if not os.path.isdir(cwd):
        raise ConfigError(f"working folder {settings.cwd!r} is not a folder of the workspace")
    return cwd


def shell_tool(roots: Roots, settings: ShellSettings, *, name: str = "shell") -> Tool:
    try:
        policy = settings.policy()
    except ValueError as exc:
        raise ConfigError(f"shell settings: {exc}") from None
    cwd = working_folder(roots, settings)
    env = build_env(settings, cwd)

    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        command: str = args["command"]
        if policy is None:
            argv = [settings.shell, "-c", command]
        else:
            argv = check_command(command, policy, roots, cwd).argv
        timeout = _bounded_by_call(settings.call_timeout(args.get("timeout")), ctx)
        try:
            completed = await run_limited(argv, roots, cwd, env, timeout, settings)
        except SandboxUnavailable as exc:
            return denied(name, str(exc))
        return shape_completed(name, completed, timeout)

    if policy is None:
        mode = "Runs any bash command"
    else:
        mode = (
            "Runs one program from the allow-list ("
            + ", ".join(sorted(policy.programs))
            + ") with its arguments; no shell syntax"
            + (f" except {' '.join(sorted(policy.operators))}" if policy.operators else "")
        )
    where = " inside a bubblewrap sandbox" if settings.isolation == "bubblewrap" else ""
    return make_tool(
        name,
        f"{mode}, in the workspace{where}. Answers stdout, stderr and the exit code; stops the "
        f"command after `timeout` seconds (default {settings.timeout:g}).",
        schema(
            ["command"],
            command={"type": "string", "minLength": 1, "description": "The command line."},
            timeout={
                "type": "number",
                "exclusiveMinimum": 0,
                "description": "Seconds before the command is killed "
                f"(at most {settings.max_timeout:g}).",
            },
        ),
        run,
        capabilities=settings.capabilities if settings.capabilities is not None else (EXEC,),
    )


def _bounded_by_call(timeout: float, ctx: ToolContext) -> float:
    """Stop the process a little before the call's own deadline, so the answer can still say
    what the command printed."""
    remaining = ctx.remaining
    if remaining is None:
        return timeout
    return max(0.01, min(timeout, remaining - 0.1))


async def run_limited(
    argv: list[str],
    roots: Roots,
    cwd: str,
    env: Mapping[str, str],
    timeout: float,
    settings: ProcessSettings,
    *,
    stdin: bytes | None = None,
    visible: tuple[str, ...] = (),
    sweep: bool = False,
) -> Completed:
    """Run ``argv`` within the settings' limits, in a sandbox when they ask for one. ``sweep``:
    outside a sandbox, look for daemons it left behind even after a clean exit (see
    ``run_process``); a sandbox's processes end with it anyway."""
    if settings.isolation != "bubblewrap":
        return await run_process(
            argv, cwd=cwd, env=env, timeout=timeout, settings=settings, stdin=stdin, sweep=sweep
        )
    sandbox = Sandbox(
        roots.paths,
        cwd,
        view=settings.view,
        network=settings.network,
        read_only_paths=(*settings.read_only_paths, *visible),
        aliases=roots.aliases,
    )
    try:
        wrapped = sandbox.wrap(argv)
        return await run_process(
            wrapped,
            cwd=cwd,
            env=env,
            timeout=timeout,
            settings=settings,
            stdin=stdin,
            helpers=HELPER_PROCESSES,
        )
    finally:
        sandbox.close()


def shape_completed(tool_name: str, done: Completed, timeout: float) -> ToolResult:
    """The ToolResult of a finished process: stdout, stderr and exit code, for people and
    models alike."""
    text = done.stdout
    if done.stderr:
        if text and not text.endswith("\n"):
            text += "\n"
        text += "[stderr]\n" + done.stderr
    error: str | None = None
    code: str | None = None
    if done.timed_out:
        error = f"the command was killed after {timeout:g}s (its deadline)"
        code = ToolErrorCode.TIMEOUT
    elif done.exit_code != 0:
        error = f"the command exited with status {done.exit_code}"
        code = ToolErrorCode.TOOL_ERROR
    if error:
        text = (text + ("\n" if text and not text.endswith("\n") else "") + f"[{error}]").strip()
    if done.truncated:
        text += (
            f"\n[output truncated: {done.stdout_cut} bytes of stdout and {done.stderr_cut} bytes "
            "of stderr cut from the middle]"
        )
    return ToolResult(
        success=error is None,
        tool_name=tool_name,
        data={
            "exit_code": done.exit_code,
            "stdout": done.stdout,
            "stderr": done.stderr,
            "timed_out": done.timed_out,
            "stdout_cut": done.stdout_cut,
            "stderr_cut": done.stderr_cut,
        },
        exit_code=done.exit_code,
        truncated=done.truncated,
        output=text,
        error=error,
        error_code=code,
        duration_ms=int(done.duration * 1000),
    )


# -- toolmesh.toml: kind "bash" ------------------------------------------------------------------


def sources_from_manifest(entry: Mapping[str, Any], *, base_dir: Path) -> list[Source]:
    """A ``kind = "bash"`` entry: one shell tool. ``entry`` is flat, as the manifest loader
    passes it: the entry's ``config`` merged in and its shared keys taken out, so an ``allow``
    here is ``config.allow``, the program allow-list (the entry's own ``allow`` filtered tool
    names and is gone). A ``config`` still nested is merged here. ``name`` (default "bash") and
    ``workspace`` (default ./workspace) sit beside the shell settings."""
    config = {key: value for key, value in entry.items() if key not in ("kind", "config")}
    config.update(entry.get("config") or {})
    name = str(config.pop("name", "bash"))
    workspace = Path(str(config.pop("workspace", "workspace")))
    folder = workspace if workspace.is_absolute() else base_dir / workspace
    folder.mkdir(parents=True, exist_ok=True)
    settings = load(ShellSettings, config, f'kind "bash" ({name})')
    return [ToolSet([shell_tool(Roots([folder]), settings, name=name)], name=f"bash:{name}")]
