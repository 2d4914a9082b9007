"""``toolmesh audit``: reading a log, whatever its path and whatever its rows hold."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import toolmesh_command
from toolmesh.audit import AuditEntry
from toolmesh.cli import CLOSED_OUTPUT, main
from toolmesh.store import SqliteStore
from toolmesh.store.sqlite import _AUDIT_COLUMNS


async def test_a_path_with_uri_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # '#', '?' and '%' mean something in a file: URI; unquoted they cut the path short.
    path = tmp_path / "a#b?c%20d.db"
    store = SqliteStore(path)
    await store.open()
    await store.append_audit(AuditEntry(tool_name="hashed", success=True))
    await store.close()
    assert main(["audit", "--db", str(path)]) == 0
    assert "hashed" in capsys.readouterr().out
    assert main(["audit", "--audit", str(path)]) == 0  # as `toolmesh serve` names it
    assert "hashed" in capsys.readouterr().out
    # No stray file named after the cut-off path ("a"): only the database and its WAL files.
    assert all(p.name.startswith(path.name) for p in tmp_path.iterdir())


async def test_a_sqlite_url_names_the_file_as_serve_store_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--db sqlite:///PATH` was taken for a file path ("no audit database at sqlite:/...")."""
    monkeypatch.chdir(tmp_path)
    store = SqliteStore(tmp_path / "logs.db")
    await store.open()
    await store.append_audit(AuditEntry(tool_name="urled", success=True))
    await store.close()
    assert main(["audit", "--db", "sqlite:///logs.db"]) == 0  # relative, as --store reads it
    assert "urled" in capsys.readouterr().out
    assert main(["audit", "--db", f"sqlite:///{tmp_path}/logs.db"]) == 0  # sqlite:////abs
    assert "urled" in capsys.readouterr().out


def foreign_row(path: Path, **values: Any) -> None:
    """An audit table with toolmesh's columns but no constraints, holding one odd row."""
    row = {
        "ts": 1.0,
        "session_id": "s",
        "agent_id": "a",
        "req_id": "r",
        "correlation_id": "c",
        "tool_name": "t",
        "source": "src",
        "transport": "stdio",
        "success": 1,
        "error_code": None,
        "duration_ms": 5,
        "input_bytes": 1,
        "output_bytes": 1,
        "args_digest": "d",
        "decision": "allow",
        "host_id": "h",
        **values,
    }
    db = sqlite3.connect(path)
    db.execute(f"CREATE TABLE audit (id INTEGER PRIMARY KEY, {', '.join(_AUDIT_COLUMNS)})")
    db.execute(
        f"INSERT INTO audit ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
        tuple(row.values()),
    )
    db.commit()
    db.close()


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        ({"ts": None}, "?  t "),
        ({"ts": "notanumber"}, "notanumber  t "),
        ({"ts": 1e20}, "1e+20  t "),
        ({"tool_name": None, "duration_ms": None, "session_id": None}, "? ms"),
        ({"success": 0, "error_code": None, "session_id": 12345678901}, "FAILED ?"),
        ({"input_bytes": b"\x00"}, "in b'\\x00' B"),
    ],
)
def test_odd_values_are_shown_not_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], values: dict[str, Any], shown: str
) -> None:
    path = tmp_path / "odd.db"
    foreign_row(path, **values)
    assert main(["audit", "--db", str(path)]) == 0
    assert shown in capsys.readouterr().out
    assert main(["audit", "--db", str(path), "--json"]) == 0
    assert capsys.readouterr().out.startswith("{")


@pytest.mark.parametrize("limit", ["-5", "0", "99999999999999999999", "ten"])
def test_limit_must_be_a_positive_whole_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], limit: str
) -> None:
    path = tmp_path / "a.db"
    foreign_row(path)
    with pytest.raises(SystemExit) as exited:
        main(["audit", "--db", str(path), "--limit", limit])
    assert exited.value.code == 2
    assert "argument --limit:" in capsys.readouterr().err


@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("rows", [1, 200])  # all within stdout's buffer, or past it
async def test_a_reader_that_left_ends_the_command_quietly(
    tmp_path: Path, rows: int, buffered: bool
) -> None:
    """`toolmesh audit --json | head -1` printed `[Errno 32] Broken pipe` and exited 2, or, the
    output still buffered, Python's own BrokenPipeError at exit and 120."""
    path = tmp_path / "a.db"
    store = SqliteStore(path)
    await store.open()
    for n in range(rows):
        await store.append_audit(AuditEntry(tool_name=f"tool_{n}", success=True))
    await store.close()
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        environment["PYTHONUNBUFFERED"] = "1"
    reader, writer = os.pipe()
    os.close(reader)  # gone before anything is written: EPIPE on the first write, every time
    try:
        shown = subprocess.run(
            toolmesh_command("audit", "--db", str(path), "--json", "--limit", "100000"),
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
            timeout=60,
            check=False,
        )
    finally:
        os.close(writer)
    assert (shown.returncode, shown.stderr) == (CLOSED_OUTPUT, "")
