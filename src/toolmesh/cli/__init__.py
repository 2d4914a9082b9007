"""The ``toolmesh`` command. Errors print as one line and exit non-zero."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from toolmesh.errors import ToolmeshError, ToolNameConflict

__all__ = ["main"]

# 128 + SIGPIPE: what the shell reports for `seq 1000000 | head -1`, whose seq is killed by the
# signal. Python ignores SIGPIPE, so it is an error here; exiting with the signal's status (not
# 0) keeps `set -o pipefail` scripts seeing toolmesh as they see coreutils: output was lost.
CLOSED_OUTPUT = 141


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line too, naming where the help is (its subcommand
    parsers are of this class as well)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# The module that registers each command, in the order `toolmesh --help` lists them. A command
# line naming one imports and builds only that one's parser: the other commands' modules and
# options are 5-15 ms of `toolmesh serve`'s cold start.
_COMMANDS = {
    "serve": "serve",
    "tools": "inspect",
    "call": "inspect",
    "audit": "audit",
    "skills": "skills",
    "agents": "agents",
    "mcp": "mcp",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``toolmesh`` parser: every command, or only ``command``'s when that is one."""
    from toolmesh import __version__

    parser = _Parser(
        prog="toolmesh",
        description="One runtime that gives LLM agents their tools.",
    )
    parser.add_argument("--version", action="version", version=f"toolmesh {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = [_COMMANDS[command]] if command in _COMMANDS else dict.fromkeys(_COMMANDS.values())
    for name in wanted:
        module = importlib.import_module(f"toolmesh.cli.{name}")
        register = module.add_parsers if name == "inspect" else module.add_parser
        register(commands)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The command a command line names: its first word that is not an option (the top level's
    options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="toolmesh: %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # The toolkit logs each name conflict too: its warning would say it again, with a line of
    # toolmesh's own source for a place.
    warnings.filterwarnings("ignore", category=ToolNameConflict)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        code: int = args.run(args)
        sys.stdout.flush()  # here, not at exit: a reader that left is then caught below
    except BrokenPipeError as exc:
        if not _stdout_is_gone():
            _print_error(exc)
            return 2
        return _leave_quietly()
    except (ToolmeshError, OSError) as exc:
        _print_error(exc)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


def _print_error(exc: BaseException) -> None:
    """One line, whatever the message holds (a peer's HTML error page, say)."""
    message = str(exc)
    if "\n" in message or "\r" in message:
        message = " ".join(message.split())
    print(f"toolmesh: error: {message}", file=sys.stderr)


def _stdout_is_gone() -> bool:
    """Whether stdout is a pipe whose reader has left (``| head``): the BrokenPipeError may
    instead come from a pipe of the command's own (a stdio host that died)."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced (a test's capture): not a pipe
        return False
    if not hasattr(select, "poll"):
        return True  # by far the likelier pipe
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _leave_quietly() -> int:
    """Point stdout at /dev/null, so that flushing what is still buffered at exit does not
    print a second BrokenPipeError, and exit as a tool killed by SIGPIPE would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return CLOSED_OUTPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
