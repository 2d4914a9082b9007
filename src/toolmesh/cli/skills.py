"""``toolmesh skills``: the skills of a folder, and the files that could not be loaded."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "skills",
        help="list the skills of a folder",
        description="List the skills (SKILL.md folders) of a folder and any that were skipped.",
    )
    parser.add_argument(
        "folder", nargs="?", default="skills", help="the skills folder (default ./skills)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from toolmesh.sources.skills import load_skills  # here: `serve` starts without it

    skills, problems = load_skills(args.folder)
    width = max((len(s.name) for s in skills), default=4)
    for skill in skills:
        print(f"{skill.name:<{width}}  {skill.summary}")
    for path, reason in problems:
        print(f"skipped {path}: {reason}")
    if not skills and not problems:
        print(f"no skills under {args.folder}")
    return 1 if problems else 0
