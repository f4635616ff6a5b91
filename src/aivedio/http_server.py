"""The aiohttp server runner both daemons serve with (the API and the worker's health port).

aiohttp answers a request it cannot parse (a control byte in a header, a line over the
limit, a NUL in the path, broken chunked encoding) before any middleware runs: it logs the
exception with its traceback, and both the log line and the 400 body it sends back carry
the parser's report, which quotes the raw request line or header. That is how a live API
key and a live playback token reached the API's log. ``make_runner`` swaps in a request
handler that answers such a request with a fixed JSON body and logs one warning,
``http_request_malformed``, naming the parser's error class and its reason but never the
bytes it quoted. A body that fails to decode (bad gzip, a broken chunk) is the same
warning, once, though aiohttp meets it twice (in the handler, and draining the body after
the answer). Errors that are ours (500) still go to aiohttp's own handling, whose log
record reaches structlog (and its redaction) through ``log_bridge``; their body never holds
a traceback, even under asyncio's debug mode (which turns aiohttp's debug on).

``stop_serving`` is the graceful stop aiohttp lacks. ``AppRunner.cleanup`` marks every
connection closing at once, and a connection marked so drops what the client sends from then
on: a request whose body was still arriving (an upload, a slow callback) can never finish and
is cut when the shutdown timeout ends. Here only idle connections are closed; one with a
request in flight keeps reading until its answer is sent (the API's answers carry
``Connection: close`` while it drains, so the connection ends there), for a bounded time.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

import anyio
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from aivedio.logs import get_logger, redact_text

log = get_logger("aivedio.http")

MALFORMED_EVENT = "http_request_malformed"
_REASON_MAX_CHARS = 120
_STATUS_PREFIX = re.compile(r"^\d{3}, message:")  # how str() of aiohttp's errors starts
# Where the parser's report starts quoting the client's bytes: a repr (b'…', bytearray(b'…'),
# '…') after a space, a colon or the start. An apostrophe inside a word ("can't") is prose.
_QUOTE = re.compile(r"""(?:^|(?<=[\s(:]))(?:bytearray\()?b?['"]""")


def parse_error_reason(message: str) -> str:
    """The prose of an aiohttp parser report, without the request bytes it quotes.

    ``"Bad status line:\\n  Expected CRLF after version:\\n\\n  b'GET /… HTTP/1.1 x'\\n  ^"``
    gives ``"Bad status line: Expected CRLF after version"``."""
    parts = []
    for line in _STATUS_PREFIX.sub("", message).splitlines():
        quote = _QUOTE.search(line)
        prose = (line[: quote.start()] if quote else line).strip(" :^")
        if prose:
            parts.append(prose)
        if quote:
            break  # the quoted bytes and the pointer under them run to the end
    return redact_text(": ".join(parts))[:_REASON_MAX_CHARS]


class _Handler(RequestHandler):
    # The body error last reported: aiohttp meets the same one in the handler and again
    # when it drains the body after the response; it is one malformed request.
    __slots__ = ("_reported",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reported: BaseException | None = None
        # aiohttp's debug (on with asyncio's debug mode) puts tracebacks in 500 bodies.
        self.debug = False

    def _report(self, exc: HttpProcessingError | web.RequestPayloadError, status: int) -> None:
        if exc is self._reported:
            return
        self._reported = exc
        peer = self.transport.get_extra_info("peername") if self.transport else None
        text = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
        log.warning(
            MALFORMED_EVENT,
            error_class=type(exc).__name__,
            reason=parse_error_reason(text),
            status=status,
            remote=str(peer[0]) if isinstance(peer, tuple) and peer else None,
        )

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError | web.RequestPayloadError):
            return super().handle_error(request, status, exc, message)
        status = status if 400 <= status < 500 else 400  # a handler let a body error out
        self._report(exc, status)
        if request.writer.output_size > 0:  # as aiohttp: a response was under way
            raise ConnectionError("a response was already started; the connection is dropped")
        code = "bad_request" if status == 400 else HTTPStatus(status).phrase.lower()
        response = web.json_response(
            {"error": {"code": code.replace(" ", "_"), "detail": "malformed HTTP request"}},
            status=status,
        )
        response.force_close()
        return response

    def close_if_idle(self) -> bool:
        """Close the connection if no request is in progress on it; True if it was idle.
        (``close()`` would only end the wait for the next request, leaving the socket open.)"""
        if self._request_in_progress:
            return False
        self.force_close()
        return True

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError | web.RequestPayloadError):
            # "Unhandled exception" from draining a body whose encoding is broken.
            self._report(exc, 400)
            return
        super().log_exception(*args, **kw)


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        # What web.Server.__call__ builds, with our handler class.
        return _Handler(self, loop=self._loop, **self._kwargs)


class _AppRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp has no setting for the handler class: the application's server is made by
        # Application._make_handler, so it is given our subclass after the fact (same state,
        # one overridden method), which tests/e2e/test_api_malformed_requests.py checks.
        server.__class__ = _Server
        return server


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """An ``AppRunner`` without access log or signal handling whose parse errors are quiet."""
    return _AppRunner(app, access_log=None, handle_signals=False, **kwargs)


async def stop_serving(runner: web.AppRunner, timeout_seconds: float) -> None:
    """Close the listening sockets, then the idle connections as they become idle, until no
    connection is left or ``timeout_seconds`` have passed; then clean up (which cancels what
    is still running after the runner's own shutdown timeout)."""
    for site in list(runner.sites):
        await site.stop()
    with anyio.move_on_after(timeout_seconds):
        # Each round closes the connections that became idle since the last; aiohttp has no
        # event for a request's end, so this polls.
        while _close_idle(runner):  # noqa: ASYNC110
            await anyio.sleep(0.05)
    await runner.cleanup()


def _close_idle(runner: web.AppRunner) -> bool:
    """Close the idle connections; True while some still have a request in progress."""
    server = runner.server
    return server is not None and bool([c for c in server.connections if not _close_if_idle(c)])


def _close_if_idle(connection: RequestHandler) -> bool:
    # Not ours (make_runner makes none such): left to the runner's cleanup.
    return connection.close_if_idle() if isinstance(connection, _Handler) else True
