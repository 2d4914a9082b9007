"""Real A2A peers (a2a-sdk 1.x servers in their own processes), one per module and flavour."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import REPO


@dataclass
class PeerProcess:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def card_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/.well-known/agent-card.json"


def start_peer(*flags: str) -> Iterator[PeerProcess]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.a2a_peer", *flags],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, "the a2a-sdk peer did not start"
        yield PeerProcess(process, json.loads(line)["port"])
    finally:
        assert process.stdin is not None
        process.stdin.close()  # the peer exits when its stdin closes
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def polled_peer() -> Iterator[PeerProcess]:
    yield from start_peer()


@pytest.fixture(scope="module")
def streaming_peer() -> Iterator[PeerProcess]:
    yield from start_peer("--streaming")


@pytest.fixture(scope="module")
def v03_peer() -> Iterator[PeerProcess]:
    yield from start_peer("--v03")
