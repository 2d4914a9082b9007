"""What only the PostgreSQL store does: URLs, migrations by concurrent hosts, clear failures."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, toolmesh_command
from tests.fixtures.postgres import PostgresCluster
from toolmesh import ConfigError
from toolmesh.audit import AuditEntry
from toolmesh.manifest import load_manifest
from toolmesh.store import SqliteStore, open_store
from toolmesh.store.postgres import PostgresStore, display_url

pytestmark = [pytest.mark.network_server]


def test_urls_pick_the_postgres_store() -> None:
    for url in ("postgresql://u@127.0.0.1:5/db", "postgres://u@127.0.0.1:5/db"):
        store = open_store(url)
        assert isinstance(store, PostgresStore) and store.shared
    assert display_url("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"
    assert "secret" not in repr(open_store("postgresql://u:secret@h:5/db"))


async def test_an_unreachable_server_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    store = PostgresStore(f"postgresql://u:pw@127.0.0.1:{port}/db", connect_timeout=2)
    with pytest.raises(ConfigError, match=r"cannot use postgresql://u:\*\*\*@127.0.0.1"):
        await store.open()


async def test_hosts_starting_together_migrate_once(
    postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    stores = [PostgresStore(postgres_url) for _ in range(4)]
    await asyncio.gather(*(store.open() for store in stores))
    database = postgres_url.rsplit("/", 1)[1]
    applied = postgres_cluster.sql(
        "SELECT track || ':' || version FROM schema_version ORDER BY track, version", database
    )
    assert applied.split() == ["cluster:1", "store:1", "store:2"]
    for store in stores:
        await store.close()


async def test_the_manifest_names_the_store(tmp_path: Path, postgres_url: str) -> None:
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(f'[toolkit]\nstore = "{postgres_url}"\n')
    assert isinstance(load_manifest(manifest).toolkit().store, PostgresStore)
    manifest.write_text('[toolkit]\nstore = "sqlite:///data/audit.db"\n')
    store = load_manifest(manifest).toolkit().store
    assert isinstance(store, SqliteStore) and store.path == str(tmp_path / "data/audit.db")
    manifest.write_text('[toolkit]\nstore = "x.db"\naudit = "y.db"\n')
    with pytest.raises(ConfigError, match="either store or audit"):
        load_manifest(manifest)
    manifest.write_text('[toolkit]\nstore = "x.db"\n')
    with pytest.raises(ConfigError, match=r"toolkit\.store: must be a URL"):
        load_manifest(manifest)


async def test_the_audit_command_reads_a_shared_store(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    await store.append_audit(AuditEntry(tool_name="shared", success=True, host_id="h1"))
    await store.close()
    shown = await asyncio.to_thread(
        subprocess.run,
        toolmesh_command("audit", "--db", postgres_url, "--json"),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    (entry,) = [json.loads(line) for line in shown.stdout.splitlines()]
    assert (entry["tool_name"], entry["host_id"]) == ("shared", "h1")


async def test_a_refused_signal_connection_fails_open_instead_of_hanging(
    postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    """The pool connected, then the connection that listens for signals was refused (the role's
    or the server's connection limit): open() waited for it forever, logging once a second."""
    database = postgres_url.rsplit("/", 1)[1]
    role = f"one_conn_{database}"
    postgres_cluster.sql(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 1')
    postgres_cluster.sql(f'ALTER DATABASE "{database}" OWNER TO "{role}"')
    url = postgres_cluster.url(database).replace("toolmesh@", f"{role}@", 1)
    store = PostgresStore(url, min_connections=1, max_connections=1)
    with pytest.raises(ConfigError, match=r"listens for signals.*too many connections"):
        await asyncio.wait_for(store.open(), 30)  # (the old code never returned)
    with pytest.raises(ConfigError, match="not open"):
        store.pool  # noqa: B018 - nothing was left open
    postgres_cluster.sql(f'ALTER ROLE "{role}" CONNECTION LIMIT 2')
    await store.open()  # the same store opens once the limit allows it
    await store.append_audit(AuditEntry(tool_name="t", success=True))
    assert [e.tool_name for e in await store.recent_audit(5)] == ["t"]
    await store.close()
