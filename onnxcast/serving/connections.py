"""Connection guards for the HTTP server: a deadline to receive each request, a connection limit.

uvicorn (0.54, httptools) arms no timer while a request is being received: its keep-alive
timeout starts only after a response, so a client that opens a socket, or sends headers and
part of a body, and then stalls holds the connection (and, mid-body, an application task)
forever; 60 such sockets were all still open after 34 s. ``limit_concurrency`` answers a
plain-text 503 only once headers are complete, so it does not bound sockets that never
finish them. The protocol class below adds both on top of uvicorn's own:

- every request (request line, headers and body) must arrive within ``read_timeout`` seconds
  of its first byte (or of the connection, for the first one); past that the server answers
  408 with a V2 error body if a request had begun, and closes the connection;
- beyond ``max_connections`` open connections a new one gets a 503 V2 error and is closed at
  once, before it can hold anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from onnxcast.serving.protocol import error_body


def guarded_protocol(*, read_timeout: float, max_connections: int,
                     on_close: Callable[[str], None] = lambda reason: None) -> type[asyncio.Protocol]:
    """An ``HttpToolsProtocol`` subclass enforcing the two limits; ``on_close(reason)`` is called
    for each connection it closes (``read_timeout`` or ``max_connections``)."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _request_begun = False

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                on_close("max_connections")
                self._answer_and_close(503, f"over the server's limit of {max_connections} connections; retry later")
                return
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._request_begun = True
            self._arm()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._request_begun = False
            self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(read_timeout, self._read_timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _read_timed_out(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            on_close("read_timeout")
            cycle = self.cycle
            if self._request_begun and (cycle is None or cycle.response_complete or not cycle.response_started):
                self._answer_and_close(408, f"request not received within {read_timeout:g} s")
            else:
                self.transport.close()

        def _answer_and_close(self, status: int, message: str) -> None:
            body = error_body(message)
            reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))
            self.transport.close()

    return GuardedHttpToolsProtocol
