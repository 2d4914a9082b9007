"""A varied catalogue of tools for the provider-format tests: nested models, enums, arrays of
objects, optional fields, dicts, recursive types, TypedDicts, dataclasses, constraints."""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Literal, TypedDict

from pydantic import BaseModel, Field

from toolmesh import Tool, ToolDefinition, tool


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Address(BaseModel):
    street: str
    city: str = Field(description="City name")
    zip_code: str | None = None


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=150)
    address: Address
    previous: list[Address] = []
    favourite: Color | None = None


class TreeNode(BaseModel):
    label: str
    children: list[TreeNode] = []


class Point(TypedDict):
    x: float
    y: float


@dataclasses.dataclass
class Window:
    width: int
    height: int
    title: str = "untitled"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


@tool
def register_person(person: Person, notify: bool = False) -> str:
    """Register a person with their addresses.

    Args:
        person: Who to register.
        notify: Send them a welcome mail.
    """
    return f"{person.name} in {person.address.city}"


@tool
def paint(
    color: Color, priority: Priority = Priority.LOW, mode: Literal["fast", "slow"] = "fast"
) -> str:
    """Paint something."""
    return f"{color.value}/{int(priority)}/{mode}"


@tool
def plot(points: list[Point], labels: dict[str, int] | None = None) -> int:
    """Plot points with optional labels."""
    return len(points)


@tool
def count_nodes(tree: TreeNode) -> int:
    """Count the nodes of a tree."""
    return 1 + sum(count_nodes.__wrapped__(child) for child in tree.children)


@tool
def open_window(window: Window, tags: set[str] | None = None) -> str:
    """Open a window."""
    return f"{window.title}:{window.width}x{window.height}"


@tool
def search(
    query: Annotated[str, Field(min_length=1, description="What to look for")],
    limit: int = 10,
    filters: list[str] | None = None,
) -> list[str]:
    """Search for things."""
    return [query] * min(limit, 2)


@tool
def move(to: tuple[int, int], label: tuple[str, int] | None = None) -> str:
    """Move to a fixed-length position."""
    return f"{to[0]},{to[1]}"


@tool
def metadata(values: dict[str, int]) -> int:
    """Sum a free-form mapping."""
    return sum(values.values())


async def _echo(arguments: dict[str, object], ctx: object) -> object:
    return arguments


dotted = Tool(
    ToolDefinition(name="fs.read", description="Read a file (a name with a dot)."),
    _echo,  # type: ignore[arg-type]
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string", "minLength": 1}},
        "required": ["path"],
    },
)

CATALOGUE = [
    add,
    move,
    ping,
    register_person,
    paint,
    plot,
    count_nodes,
    open_window,
    search,
    metadata,
    dotted,
]
RECURSIVE = {"count_nodes"}
FREE_FORM = {"metadata", "plot"}  # dicts: no strict mode for OpenAI
