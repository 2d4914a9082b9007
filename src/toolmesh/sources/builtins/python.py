"""The python tool (capability code::python): runs Python code in a child interpreter.

The code goes to the interpreter on stdin (``python -E -s -``: no PYTHON* variables, no user
site folder) in the workspace, within the shell tool's process limits. By default it runs inside
bubblewrap with an overlay view of the workspace and no network: code a model wrote is the
least trusted thing there is. Without bubblewrap the call fails with how to install it, unless
the settings say ``isolation = "none"``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

from toolmesh.sources.builtins.base import denied, make_tool, schema
from toolmesh.sources.builtins.confine import Roots
from toolmesh.sources.builtins.process import ProcessSettings, build_env
from toolmesh.sources.builtins.sandbox import SandboxUnavailable
from toolmesh.sources.builtins.shell import run_limited, shape_completed, working_folder
from toolmesh.tools import Tool, ToolContext

__all__ = ["PythonSettings", "python_tool"]

RUN = "code::python"


@dataclass(frozen=True, slots=True)
class PythonSettings(ProcessSettings):
    """The python tool: which interpreter, and the process limits."""

    isolation: Literal["none", "bubblewrap"] = "bubblewrap"
    interpreter: str = ""  # default: the interpreter toolmesh runs on
    max_code_bytes: int = 1024 * 1024
    capabilities: tuple[str, ...] | None = None  # None: code::python


def python_tool(roots: Roots, settings: PythonSettings) -> Tool:
    interpreter = settings.interpreter or sys.executable
    cwd = working_folder(roots, settings)
    env = build_env(settings, cwd)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    env.setdefault("PYTHONIOENCODING", "utf-8")
    visible = _interpreter_paths(interpreter)

    async def run(args: dict[str, Any], ctx: ToolContext) -> Any:
        code = args["code"].encode("utf-8")
        if len(code) > settings.max_code_bytes:
            raise ValueError(
                f"the code is {len(code)} bytes; the limit is {settings.max_code_bytes}"
            )
        timeout = settings.call_timeout(args.get("timeout"))
        if ctx.remaining is not None:
            timeout = max(0.01, min(timeout, ctx.remaining - 0.1))
        argv = [interpreter, "-E", "-s", "-"]
        try:
            done = await run_limited(  # code may fork and detach: swept after it ends
                argv, roots, cwd, env, timeout, settings, stdin=code, visible=visible, sweep=True
            )
        except SandboxUnavailable as exc:
            return denied("python", str(exc))
        return shape_completed("python", done, timeout)

    where = " in a bubblewrap sandbox" if settings.isolation == "bubblewrap" else ""
    return make_tool(
        "python",
        f"Run Python code{where} with the workspace as the working folder. Answers what it "
        "printed (stdout, stderr) and its exit code; print what you want to see.",
        schema(
            ["code"],
            code={"type": "string", "minLength": 1, "description": "Python source code."},
            timeout={
                "type": "number",
                "exclusiveMinimum": 0,
                "description": f"Seconds before it is killed (default {settings.timeout:g}).",
            },
        ),
        run,
        capabilities=settings.capabilities if settings.capabilities is not None else (RUN,),
    )


def _interpreter_paths(interpreter: str) -> tuple[str, ...]:
    """Folders the interpreter needs to see inside a sandbox (its prefix, a venv's base)."""
    paths = {os.path.dirname(os.path.dirname(os.path.realpath(interpreter)))}
    if os.path.realpath(interpreter) == os.path.realpath(sys.executable):
        paths.update({sys.prefix, sys.base_prefix, sys.exec_prefix})
    else:
        paths.add(os.path.dirname(os.path.dirname(os.path.abspath(interpreter))))
    return tuple(sorted(p for p in paths if p and p != "/"))
