"""Hostile backends for the analyzer's tests: an HTTP server on a loopback address (127.0.0.1, or 127.0.0.2,
which is loopback too and another origin) whose every answer is written by the test, byte by byte if it likes.

``HostileServer(behave, host)``: ``behave(handler)`` answers one request (``handler.path``, ``handler.command``,
``handler.headers``, ``handler.body`` for POST; write with ``handler.raw(bytes)`` or ``handler.json(status, obj)``);
``requests`` lists ``(method, path, Authorization header)`` of every request received; ``stop`` is set at close so
a dripping answer ends with the test. Used for Jaeger and Alertmanager alike.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HostileServer:
    def __init__(self, behave: Callable[[Any], None], host: str = "127.0.0.1") -> None:
        self.behave = behave
        self.requests: list[tuple[str, str, str | None]] = []
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.body = self.rfile.read(n) if n else b""
                server.requests.append((self.command, self.path, self.headers.get("Authorization")))
                try:
                    server.behave(self)
                except (BrokenPipeError, ConnectionResetError):   # the client gave up: what the test wants
                    pass
                self.close_connection = True

            do_GET = do_POST = _any  # noqa: N815 (http.server API)

            def raw(self, data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()

            def json(self, status: int, obj: Any, extra: dict[str, str] | None = None) -> None:
                body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.raw(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


def drip(data: bytes, every_s: float, stop: threading.Event) -> Callable[[Any], None]:
    """A behaviour that writes ``data`` (status line, headers and all) one byte every ``every_s`` seconds."""

    def behave(h: Any) -> None:
        for i in range(len(data)):
            if stop.wait(every_s):
                return
            h.raw(data[i:i + 1])

    return behave


def services_ok(h: Any) -> bool:
    """Answer ``/api/services`` like Jaeger (watch asks it first); True when it did."""
    if h.path.startswith("/api/services"):
        h.json(200, {"data": ["sglang-hicache"], "total": 1, "errors": None})
        return True
    return False
