"""``toolmesh audit``: the newest entries of an audit log."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from toolmesh.audit import AuditEntry
from toolmesh.cli.loading import DEFAULT_AUDIT, default_audit
from toolmesh.errors import ConfigError
from toolmesh.store import open_store, sqlite_path
from toolmesh.store.sqlite import read_audit

__all__ = ["add_parser"]

_MAX_LIMIT = 2**63 - 1  # SQLite's largest integer


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "audit",
        help="show recent audit entries",
        description="Show the newest entries of a toolmesh audit log (a SQLite file).",
    )
    parser.add_argument(
        "--db",
        "--audit",  # the name `toolmesh serve` gives the same file
        dest="db",
        default=default_audit(),
        help=f"the audit database: a SQLite file (default {DEFAULT_AUDIT}) or a "
        "postgresql:// store URL",
    )
    parser.add_argument("--limit", type=_limit, default=20, help="how many entries (default 20)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(run=run)


def _limit(text: str) -> int:
    """``--limit``: a positive whole number SQLite can take (argparse reports anything else)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= _MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be between 1 and {_MAX_LIMIT}, not {value}")
    return value


def run(args: argparse.Namespace) -> int:
    if str(args.db).startswith(("postgresql://", "postgres://")):
        return _show(asyncio.run(_shared_audit(args.db, args.limit)), args)
    path = Path(sqlite_path(args.db) if str(args.db).startswith("sqlite://") else args.db)
    if not path.is_file():
        raise ConfigError(f"no audit database at {path} (serve with --audit {path} first)")
    try:
        # Quoted: '#', '?' or '%' in the path would otherwise end it early or drop mode=ro.
        db = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
        try:
            entries = read_audit(db, args.limit)
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise ConfigError(f"{path} is not a toolmesh audit database: {exc}") from exc
    return _show(entries, args)


async def _shared_audit(url: str, limit: int) -> list[AuditEntry]:
    store = open_store(url)
    await store.open()
    try:
        return await store.recent_audit(limit)
    finally:
        await store.close()


def _show(entries: list[AuditEntry], args: argparse.Namespace) -> int:
    # A file written by something else may hold any value in any column: show it, never crash.
    if args.json:
        for entry in entries:
            print(json.dumps(entry.to_dict(), default=repr))
        return 0
    for entry in reversed(entries):
        outcome = "ok" if entry.success else f"FAILED {_text(entry.error_code)}"
        print(
            f"{_when(entry.ts)}  {_text(entry.tool_name):<24} {outcome:<28} "
            f"{_text(entry.duration_ms):>6} ms  "
            f"in {_text(entry.input_bytes)} B  out {_text(entry.output_bytes)} B  "
            f"session {_text(entry.session_id)[:8]}  {_text(entry.transport)}"
        )
    if not entries:
        print("the audit log is empty")
    return 0


def _when(ts: Any) -> str:
    try:
        return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):  # NULL, text, out of range
        return _text(ts)


def _text(value: Any) -> str:
    return "?" if value is None else str(value)
