"""A toolkit served on one HTTP port: A2E always, and as an A2A agent and an MCP server on
request (``toolkit.serve``).

MCP is ``toolmesh.mcp.http.mcp_routes`` at ``/mcp`` (it needs the ``mcp`` extra; without it,
``mcp=`` is refused with a ConfigError saying so).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from starlette.routing import BaseRoute

from toolmesh.errors import ConfigError
from toolmesh.host import Host
from toolmesh.protocol import DEFAULT_MAX_MESSAGE_BYTES
from toolmesh.store import Store, open_store
from toolmesh.transports.http import HttpServer

if TYPE_CHECKING:
    from toolmesh.a2a.server import A2AServer
    from toolmesh.llm.client import LLMClient
    from toolmesh.toolkit import Toolkit

__all__ = ["ServeHandle", "serve_toolkit"]

_A2A_OPTIONS = {"name", "description", "version", "instructions", "store", "max_turns"}


class ServeHandle:
    """A running server: ``url`` (``http://127.0.0.1:PORT``) and ``await stop()``."""

    def __init__(
        self,
        server: HttpServer,
        host: Host,
        a2a: A2AServer | None,
        owned_store: Store | None,
    ) -> None:
        self.server = server
        self.host = host
        self.a2a = a2a
        self._owned_store = owned_store
        self.url = server.url

    async def stop(self) -> None:
        """Stop serving: running A2A tasks end as failed, A2E sessions close, the port is freed.
        The toolkit stays open."""
        if self.a2a is not None:
            await self.a2a.close()
        await self.server.stop()
        await self.host.close()
        if self._owned_store is not None:
            await self._owned_store.close()

    async def wait(self) -> None:
        """Until the server stops."""
        await self.server.wait()

    async def __aenter__(self) -> ServeHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"ServeHandle({self.url!r})"


async def serve_toolkit(
    toolkit: Toolkit,
    bind: str = "127.0.0.1:0",
    *,
    client: LLMClient | None = None,
    a2a: Mapping[str, Any] | str | bool | None = None,
    mcp: Any = None,
    auth_token: str | None = None,
    allowed_origins: Sequence[str] = (),
    max_parallel: int = 8,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> ServeHandle:
    """Serve ``toolkit`` on ``bind`` and return once the port listens (see ``Toolkit.serve``)."""
    routes: list[BaseRoute] = []
    agent_server, owned = None, None
    if a2a is not None and a2a is not False:
        agent_server, owned = _a2a_server(toolkit, client, a2a, auth_token, allowed_origins)
        routes.extend(agent_server.routes())
    host = Host(
        toolkit,
        auth_token=auth_token,
        max_parallel=max_parallel,
        max_message_bytes=max_message_bytes,
    )
    if not toolkit.pipeline.host_id:
        # The A2A agent's calls run through the toolkit's pipeline: audited with the host's id
        # too, so that in a cluster each row says which host made the call.
        toolkit.pipeline.host_id = host.host_id
    if mcp is not None and mcp is not False:
        routes.extend(_mcp_routes(host, mcp, auth_token, allowed_origins))
    server = HttpServer(
        host, bind, auth_token=auth_token, allowed_origins=allowed_origins, extra_routes=routes
    )
    try:
        if agent_server is not None:
            await agent_server.start()
        await server.start()
    except BaseException:
        # Not served (the port is taken, the store cannot open): what started stops, or a
        # shared store's heartbeat and cancel subscription would outlive the attempt.
        if agent_server is not None:
            await agent_server.close()
        await host.close()
        if owned is not None:
            await owned.close()
        raise
    return ServeHandle(server, host, agent_server, owned)


def _a2a_server(
    toolkit: Toolkit,
    client: LLMClient | None,
    options: Mapping[str, Any] | str | bool,
    auth_token: str | None,
    allowed_origins: Sequence[str],
) -> tuple[A2AServer, Store | None]:
    from toolmesh.a2a.server import A2AServer

    if client is None:
        raise ConfigError(
            "serving as an A2A agent needs client= (from create_client) to run its tasks"
        )
    if options is True:
        settings: dict[str, Any] = {"name": toolkit.name}
    elif isinstance(options, str):
        settings = {"name": options}
    elif isinstance(options, Mapping):
        settings = {"name": toolkit.name, **options}  # named as a2a=True names it, by default
    else:
        raise ConfigError(f"a2a= must be a mapping, a name or True, not {options!r}")
    unknown = sorted(set(settings) - _A2A_OPTIONS)
    if unknown:
        raise ConfigError(
            f"a2a= has unknown settings {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_A2A_OPTIONS))})"
        )
    store = open_store(settings.pop("store")) if settings.get("store") is not None else None
    settings.pop("store", None)
    server = A2AServer(
        toolkit,
        client,
        store=store,
        auth_token=auth_token,
        allowed_origins=tuple(allowed_origins),
        **settings,
    )
    return server, store


def _mcp_routes(
    host: Host, options: Any, auth_token: str | None, allowed_origins: Sequence[str]
) -> list[BaseRoute]:
    try:
        module = importlib.import_module("toolmesh.mcp.http")
    except ImportError as exc:
        raise ConfigError(
            f"toolkit.serve(mcp=...): this build cannot serve MCP yet ({exc})"
        ) from None
    settings = {} if options is True else options
    if not isinstance(settings, Mapping):
        raise ConfigError(f"mcp= must be True or a mapping of settings, not {options!r}")
    routes: list[BaseRoute] = module.mcp_routes(
        host, auth_token=auth_token, allowed_origins=tuple(allowed_origins), **settings
    )
    return routes
