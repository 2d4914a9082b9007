"""Seed 002's three examples, run as they are (imports changed only) from the repository root."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

SEED_FILE = "shared/seeds/002_ffcb4e7fbf0c3ec6.txt"  # shared/ sits beside the checkout

EXAMPLES = {
    "seed002_agent_tools_basic.py": "ok: ['video-desk_hello-world']",
    "seed002_register_tools.py": "ok: resolved manually",
    "seed002_endpoint_fallback.py": "ok: ['multi-skill-desk_summarize', 'multi-skill-desk_translate']",
}


@pytest.mark.network_server
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_seed_example_runs(name: str) -> None:
    done = subprocess.run(
        [sys.executable, f"examples/{name}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == EXAMPLES[name]


def test_examples_are_the_seeds_own() -> None:
    assert (REPO / "examples" / "skills" / "hello-world" / "SKILL.md").is_file()
    found = [p / SEED_FILE for p in (REPO.parent, REPO.parent.parent) if (p / SEED_FILE).is_file()]
    if not found:
        pytest.skip("the seed documents are not beside this checkout")
    seed = found[0].read_text(encoding="utf-8")
    for name in EXAMPLES:
        code = (REPO / "examples" / name).read_text(encoding="utf-8")
        assert code.replace("toolmesh", "toolnexus").rstrip("\n") in seed, name
