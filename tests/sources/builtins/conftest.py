"""Fixtures of the built-in tool tests: a workspace with a secret folder beside it."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from toolmesh import Toolkit, create_toolkit

SECRET = "the secret outside the workspace\n"

requires_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("CI"),
    reason="bubblewrap is not installed (make setup installs it as root)",
)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text(SECRET)
    return folder


@pytest.fixture
def workspace(tmp_path: Path, outside: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


Make = Callable[..., Any]


@pytest.fixture
async def make_kit(workspace: Path) -> AsyncIterator[Make]:
    """Build toolkits of built-ins confined to ``workspace``; closed after the test."""
    made: list[Toolkit] = []

    async def make(builtins: Any = True, **options: Any) -> Toolkit:
        kit = await create_toolkit(builtins=builtins, workspace=workspace, **options)
        made.append(kit)
        return kit

    yield make
    for kit in made:
        await kit.close()
