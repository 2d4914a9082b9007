"""A plain static web site (``python -m http.server``) on 127.0.0.1: a peer that is no A2E host
and answers errors with whole HTML pages (501 to POST, 404 for a missing file)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["static_site"]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request log would bury what a failing test printed


@contextlib.contextmanager
def static_site(folder: Path) -> Iterator[str]:
    """Serve ``folder``; yields the site's URL (listening before it is yielded), and stops the
    server on leaving."""
    handler = functools.partial(_Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
