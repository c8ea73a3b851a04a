"""How much one API process takes at once: uvicorn's options from ``settings.api_server`` and
an HTTP protocol that bounds a request's head.

uvicorn's httptools protocol gathers a request line and headers without a bound (``h11``'s
``h11_max_incomplete_event_size`` does not apply to it): :class:`BoundedHttpTools` closes a
connection whose unfinished head passes ``max_head_bytes`` with ``431``.
"""

from __future__ import annotations

from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from notiflow.settings import ServerLimits

HEAD_TOO_LARGE: Final = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                         b"content-type: text/plain; charset=utf-8\r\n"
                         b"content-length: 24\r\nconnection: close\r\n\r\n"
                         b"request head too large\r\n")


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments of ``limits`` (the bounded protocol
    included)."""
    return {"http": BoundedHttpTools,
            "limit_concurrency": limits.max_concurrency,
            "backlog": limits.backlog,
            "timeout_keep_alive": max(1, round(limits.keep_alive.total_seconds())),
            "h11_max_incomplete_event_size": limits.max_head_bytes}


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol; a request whose line and headers are still unfinished
    after ``config.h11_max_incomplete_event_size`` bytes (plus at most the read that began
    them) is answered ``431`` and its connection closed."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.max_head: int = config.h11_max_incomplete_event_size or 64 * 1024
        self.in_head = False
        self.head_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.in_head = True
        self.head_bytes = 0

    def on_headers_complete(self) -> None:
        self.in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        counting = self.in_head
        super().data_received(data)
        if not (counting and self.in_head):
            return
        self.head_bytes += len(data)
        if self.head_bytes > self.max_head and not self.transport.is_closing():
            self.transport.write(HEAD_TOO_LARGE)
            self.transport.close()
