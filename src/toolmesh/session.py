"""A session: one agent's connection to a host, what it holds and how many calls it runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolmesh.capabilities import CapabilitySet
from toolmesh.models import secret_id

if TYPE_CHECKING:
    from toolmesh.pipeline import Approver

__all__ = ["Session"]


@dataclass(slots=True, eq=False)
class Session:
    """Who is calling (``agent_id``), what they may call (``capabilities``) and their limits."""

    capabilities: CapabilitySet = field(default_factory=CapabilitySet)
    agent_id: str = ""
    id: str = field(default_factory=secret_id)
    max_parallel: int = 8
    transport: str = "inprocess"
    a2e_caps: frozenset[str] = frozenset({"tools"})
    created_at: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)
    active_calls: int = 0
    approver: Approver | None = None
