"""Request bodies read whole: every byte the client sends, bounded in size and in time.

``request.content.read(n)`` answers what has *arrived* (at least one byte, at most ``n``),
not the body: a signed callback split over two TCP segments 0.3 s apart was verified over
its first segment and refused as a bad signature. A body arrives in as many pieces as TLS
records, proxies and slow links make of it, so ``read_body`` reads until the end of the
body (``Content-Length`` reached, or the last chunk of a chunked body) and only then hands
it on, so nothing is ever verified or parsed over half a body:

* over ``limit_bytes`` is 413, refused before reading when ``Content-Length`` says so, and
  at the first byte past the limit otherwise (a chunked body has no length to trust);
* not whole within ``timeout_seconds`` (a ``Content-Length`` larger than what is sent, a
  client that stalls) is 408, and the connection is closed rather than kept alive, since
  the rest of that body could otherwise be read as the next request;
* a connection lost or a chunked encoding broken mid-body is 400: what arrived is not a
  body. A ``Content-Length`` beside ``Transfer-Encoding: chunked`` never gets here: the
  HTTP parser refuses it (400), as a request smuggling attempt.
"""

from __future__ import annotations

import aiohttp
import anyio
from aiohttp import http_exceptions, web

from aivedio.api.problems import ApiError
from aivedio.logs import get_logger

log = get_logger("aivedio.api")

READ_CHUNK_BYTES = 64 * 1024


async def read_body(
    request: web.Request, *, limit_bytes: int, timeout_seconds: float, what: str = "request body"
) -> bytes:
    """The whole body, or ApiError 413, 408 or 400 (see the module docstring)."""
    too_large = ApiError(413, f"the {what} is over {limit_bytes} bytes", "too_large")
    if request.content_length is not None and request.content_length > limit_bytes:
        raise too_large
    chunks: list[bytes] = []
    total = 0
    try:
        with anyio.fail_after(timeout_seconds):
            async for chunk in request.content.iter_chunked(READ_CHUNK_BYTES):
                total += len(chunk)
                if total > limit_bytes:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            408,
            f"the {what} was not whole after {timeout_seconds:g} s ({total} bytes arrived)",
            "body_timeout",
        ) from None
    except ConnectionError as exc:
        # The client went away mid-body, or sent framing the parser gave up on (aiohttp then
        # reports the connection closing): one warning, as problems.py logs it elsewhere.
        log.warning("http_request_incomplete", error_class=type(exc).__name__, path=request.path)
        raise ApiError(
            400, f"the {what} ended early: {type(exc).__name__}", "body_incomplete"
        ) from None
    except (aiohttp.ClientPayloadError, http_exceptions.HttpProcessingError) as exc:
        # Broken framing or encoding: not logged here, http_server.py logs it once when
        # aiohttp drains the body after the response.
        raise ApiError(
            400, f"the {what} ended early: {type(exc).__name__}", "body_incomplete"
        ) from None
    return b"".join(chunks)
