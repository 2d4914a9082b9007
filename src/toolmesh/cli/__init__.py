"""The ``toolmesh`` command. Errors print as one line and exit non-zero."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from toolmesh.errors import ToolmeshError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line too, naming where the help is (its subcommand
    parsers are of this class as well)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from toolmesh import __version__
    from toolmesh.cli import agents, audit, inspect, mcp, serve, skills

    parser = _Parser(
        prog="toolmesh",
        description="One runtime that gives LLM agents their tools.",
    )
    parser.add_argument("--version", action="version", version=f"toolmesh {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve.add_parser(commands)
    inspect.add_parsers(commands)
    audit.add_parser(commands)
    skills.add_parser(commands)
    agents.add_parser(commands)
    mcp.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="toolmesh: %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        code: int = args.run(args)
    except ToolmeshError as exc:
        print(f"toolmesh: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"toolmesh: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
