"""Every CLI test audits into a folder of its own: ``toolmesh call`` audits as ``serve`` does, to
``./toolmesh-audit.db`` unless ``TOOLMESH_AUDIT`` says otherwise, and the tests run in the
repository."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _audit_elsewhere(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLMESH_AUDIT", str(tmp_path_factory.mktemp("audit") / "audit.db"))
