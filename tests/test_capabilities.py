"""Capability tags: whole-segment prefix matching (seed 003) and the session policy."""

from __future__ import annotations

import pytest

from toolmesh import CapabilityError, ConfigError
from toolmesh.capabilities import CapabilitySet, satisfies, session_capabilities


@pytest.mark.parametrize(
    ("held", "required", "granted"),
    [
        (["math"], "math::add", True),
        (["math"], "math::x::y", True),
        (["math"], "math", True),
        (["math::add"], "math::add", True),
        (["math::add"], "math", False),
        (["math::add"], "math::addition", False),
        (["math"], "mathematics", False),
        (["math"], "mathematics::add", False),
        ([], "math", False),
        (["fs", "net"], "net::http", True),
        (["*"], "anything::at::all", True),
        (["fs::read"], "fs::read::meta", True),
        (["fs::read"], "fs::write", False),
        (["fs::read"], "fs", False),
        (["a::b::c"], "a::b::c::d::e", True),
        (["a::b::c"], "a::b", False),
        (["a::b::c"], "a::b::cd", False),
        (["a::b", "x"], "x::y", True),
        ([], "", False),
        (["net"], "network::http", False),
        (["net::http"], "net::https", False),
        (["net::http", "net::https"], "net::https", True),
        (["code"], "code::python", True),
        (["shell::exec"], "shell", False),
    ],
)
def test_satisfies(held: list[str], required: str, granted: bool) -> None:
    assert satisfies(held, required) is granted


def test_tool_without_requirements_is_always_allowed() -> None:
    assert CapabilitySet([]).allows([])


def test_every_requirement_must_be_granted() -> None:
    held = CapabilitySet(["fs::read"])
    assert held.missing(["fs::read", "fs::write"]) == "fs::write"
    assert not held.allows(["fs::read", "fs::write"])


@pytest.mark.parametrize("tag", ["", "a::", "::a", "a b", "a:b"])
def test_malformed_tags_are_refused(tag: str) -> None:
    with pytest.raises(ConfigError):
        CapabilitySet([tag])


def test_locked_policy_refuses_changes() -> None:
    host = CapabilitySet(["fs"])
    assert session_capabilities(host, "locked") is host
    with pytest.raises(CapabilityError, match="locked"):
        session_capabilities(host, "locked", "extend", ["net"])


def test_extensible_policy() -> None:
    host = CapabilitySet(["fs"])
    assert session_capabilities(host, "extensible", "extend", ["net"]).tags == {"fs", "net"}
    assert session_capabilities(host, "extensible", "replace", ["net"]).tags == {"net"}
    assert session_capabilities(host, "extensible", "inherit").tags == {"fs"}
