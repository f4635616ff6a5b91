"""One response body into a sink: counted, capped, hashed, and cut-short bodies told apart.

* An encoded body (``Content-Encoding`` other than identity) is refused, never inflated: a
  byte cap and a checksum mean something only over the bytes on the wire.
* A ``Content-Length`` over the cap is refused before reading; without one, reading stops at
  cap + 1 byte. Each chunk goes through the counter and SHA-256 into the sink, and the sink's
  ``await`` is the backpressure: a slow store reads the socket slower.
* A body that stops short (dropped connection, stalled read, fewer bytes than stated) raises
  ``BodyInterruptedError``, which the fetch may resume; the bytes aiohttp had received but
  not handed out when it failed are given to the sink first, so the resume starts at the
  exact byte of the cut.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec

from aivedio.errors import InvalidResponseError, TooLargeError, TransientError
from aivedio.logs import url_for_log
from aivedio.net.resume import Validator, validator_of
from aivedio.transfer_cpu import measured

Sink = Callable[[bytes], Awaitable[None]]

_BATCH_BYTES = 1 << 20


class FetchResult(msgspec.Struct, frozen=True, kw_only=True):
    url: str  # for logs: scheme, host, port and a path hash
    status: int
    bytes: int
    sha256: str
    content_length: int | None
    content_type: str | None
    addresses: list[str]
    redirects: list[str]  # hosts of each hop after the first (of the last request)
    resumes: int = 0  # bodies continued from where they were cut (a 206)
    restarts: int = 0  # bodies started over from byte 0 (a 200, or a refused 206)


class BodyInterruptedError(TransientError):
    """The body stopped short (connection dropped, stalled read): it may be resumed."""


class FetchProgress:
    """One fetch's progress: the body so far and what a resume of it needs."""

    def __init__(self) -> None:
        self.received = 0  # bytes of the current body given to the sink
        self.hasher = hashlib.sha256()
        self.addresses: list[str] = []
        self.redirects: list[str] = []
        self.started = False  # a 200 began the current body
        self.validator: Validator | None = None
        self.total: int | None = None  # the object's size, when a response stated it
        self.content_type: str | None = None
        self.resume = False  # the next request continues the body from ``received``
        self.ranges_refused = False  # a 206 was refused: no more ranges for this fetch
        self.requests = 0  # requests for the body so far
        self.resumes = 0
        self.restarts = 0

    def begin(self, response: aiohttp.ClientResponse) -> None:
        """A 200: the body starts at byte 0 (``forget`` ran, if a body came before it)."""
        self.started = True
        self.validator = validator_of(response.headers)
        self.total = response.content_length
        self.content_type = response.headers.get("Content-Type")

    def forget(self) -> None:
        self.received = 0
        self.hasher = hashlib.sha256()
        self.started = False
        self.validator = None
        self.total = None


async def read_body(
    url: str,
    response: aiohttp.ClientResponse,
    sink: Sink,
    cap: int,
    state: FetchProgress,
    progress: Callable[[int], None] | None,
    *,
    idle_read_timeout_seconds: float,
) -> FetchResult:
    """The body (or the rest of it, from ``state.received``) into the sink.
    ``idle_read_timeout_seconds``: the client's idle read deadline, for the error text."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise InvalidResponseError(
            f"encoded body ({encoding}) from {url_for_log(url)} refused; never inflated"
        )
    start = state.received
    length = response.content_length
    if length is not None and start + length > cap:
        raise TooLargeError(f"Content-Length {start + length} exceeds the cap of {cap} bytes")
    hasher = state.hasher
    # Chunks are as small as a TLS record: they are hashed, and their CPU accounted, a batch
    # at a time (two clock reads per batch, not per chunk, cost a quarter of the hashing),
    # then handed to the sink one by one. A batch is at most ``_BATCH_BYTES`` behind the
    # socket, and what was received before an error is given to the sink before it is raised.
    batch: list[bytes] = []
    batched = 0

    async def flush() -> None:
        nonlocal batched
        chunks = batch.copy()
        batch.clear()
        batched = 0
        with measured("fetch"):
            for chunk in chunks:
                hasher.update(chunk)
        for chunk in chunks:
            state.received += len(chunk)
            await sink(chunk)
        if progress is not None and chunks:
            progress(state.received)

    async def take(chunk: bytes) -> None:
        nonlocal batched
        if state.received + batched + len(chunk) > cap:
            await flush()
            raise TooLargeError(f"body exceeds the cap of {cap} bytes")
        batch.append(chunk)
        batched += len(chunk)
        if batched >= _BATCH_BYTES:
            await flush()

    try:
        try:
            while True:
                # One received chunk at a time, as aiohttp's parser made it: ``readany``
                # would join what is buffered into a new object (a copy, and a page fault
                # a page once that reaches glibc's mmap threshold).
                chunk, end_of_http_chunk = await response.content.readchunk()
                if not chunk:
                    if end_of_http_chunk:
                        continue  # the end of a chunk of a chunked body, not of the body
                    break
                await take(chunk)
            await flush()
        except aiohttp.ClientError:
            for chunk in unread_buffer(response.content):
                await take(chunk)
            await flush()
            raise
        except TimeoutError:
            await flush()
            raise
    except aiohttp.ClientPayloadError:
        raise BodyInterruptedError(
            f"body from {url_for_log(url)} truncated after {state.received} bytes"
        ) from None
    except (aiohttp.ServerTimeoutError, TimeoutError):
        raise BodyInterruptedError(
            f"idle read deadline: no data from {url_for_log(url)} for "
            f"{idle_read_timeout_seconds:g}s after {state.received} bytes"
        ) from None
    except aiohttp.ClientError as exc:
        raise BodyInterruptedError(
            f"reading {url_for_log(url)} failed after {state.received} bytes: {type(exc).__name__}"
        ) from None
    if length is not None and state.received - start != length:
        raise BodyInterruptedError(
            f"body from {url_for_log(url)} truncated: {state.received} of {start + length} bytes"
        )
    # A 206 may come without a length (read to the close): the object's size decides.
    if state.started and state.total is not None and state.received != state.total:
        if state.received > state.total:
            raise InvalidResponseError(
                f"body from {url_for_log(url)} ran past its stated size of {state.total} bytes"
            )
        raise BodyInterruptedError(
            f"body from {url_for_log(url)} truncated: {state.received} of {state.total} bytes"
        )
    # Of the object (the first response), not of the part of it a 206 carried.
    if state.started:
        total, content_type = state.total, state.content_type
    else:  # a body read without a transfer around it (fetch_json)
        total, content_type = length, response.headers.get("Content-Type")
    return FetchResult(
        url=url_for_log(url),
        status=response.status,
        bytes=state.received,
        sha256=hasher.hexdigest(),
        content_length=total,
        content_type=content_type,
        addresses=state.addresses,
        redirects=state.redirects,
        resumes=state.resumes,
        restarts=state.restarts,
    )


def unread_buffer(content: aiohttp.StreamReader) -> list[bytes]:
    """The bytes aiohttp received for a body but had not handed out when it failed.

    aiohttp's reader raises a body's error (the connection closed short of its length) on
    the next read even while it still buffers bytes received before it (up to twice
    ``read_bufsize``): they would be lost, and a resume would ask for them again. They are
    taken from its buffer (a private deque of ``bytes``, checked for that shape: should a
    later aiohttp change it, nothing is taken and the resume starts a little earlier, which
    the resume tests, expecting each resume at the exact byte of its cut, would show). The
    reader is dead by then; its own counters are left as they are.
    """
    buffer = getattr(content, "_buffer", None)
    if not isinstance(buffer, collections.deque) or not all(
        isinstance(chunk, bytes) for chunk in buffer
    ):
        return []
    chunks = list(buffer)
    buffer.clear()
    return chunks
