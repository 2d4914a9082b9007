"""``toolmesh audit``: the newest entries of an audit log."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from toolmesh.audit import AuditEntry
from toolmesh.cli.loading import DEFAULT_AUDIT
from toolmesh.errors import ConfigError
from toolmesh.store import open_store
from toolmesh.store.sqlite import read_audit

__all__ = ["add_parser"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "audit",
        help="show recent audit entries",
        description="Show the newest entries of a toolmesh audit log (a SQLite file).",
    )
    parser.add_argument(
        "--db",
        default=os.environ.get("TOOLMESH_AUDIT", DEFAULT_AUDIT),
        help=f"the audit database: a SQLite file (default {DEFAULT_AUDIT}) or a "
        "postgresql:// store URL",
    )
    parser.add_argument("--limit", type=int, default=20, help="how many entries (default 20)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if str(args.db).startswith(("postgresql://", "postgres://")):
        return _show(asyncio.run(_shared_audit(args.db, args.limit)), args)
    path = Path(args.db)
    if not path.is_file():
        raise ConfigError(f"no audit database at {path} (serve with --audit {path} first)")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        entries = read_audit(db, args.limit)
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
    if args.json:
        for entry in entries:
            print(json.dumps(entry.to_dict()))
        return 0
    for entry in reversed(entries):
        when = datetime.datetime.fromtimestamp(entry.ts).strftime("%Y-%m-%d %H:%M:%S")
        outcome = "ok" if entry.success else f"FAILED {entry.error_code}"
        print(
            f"{when}  {entry.tool_name:<24} {outcome:<28} {entry.duration_ms:>6} ms  "
            f"in {entry.input_bytes} B  out {entry.output_bytes} B  "
            f"session {entry.session_id[:8]}  {entry.transport}"
        )
    if not entries:
        print("the audit log is empty")
    return 0
