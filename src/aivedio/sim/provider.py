"""A simulated AI-video provider: task API, signed download URLs and injectable faults.

One aiohttp server (HTTPS with a test CA, or plain HTTP) on a loopback address, for tests and
the demo. Routes:

- ``GET /v1/tasks/{task_id}``: ``{"id", "status": "SUCCEEDED", "outputs": [...]}``, each output
  ``{"index", "url", "expires_at", "sha256", "size", "content_type"}`` with a fresh signed URL.
- ``POST /v1/tasks/{task_id}/outputs/{index}/refresh``: ``{"url", "expires_at"}``.
- ``GET /files/{task_id}/{index}?exp=UNIX&sig=HEX``: the file, after the signature check and
  the output's :class:`Faults`.
- ``GET /r/{hop}/files/{task_id}/{index}?exp=UNIX&sig=HEX``: the redirect chain of
  ``Faults.redirect_hops``; the last hop serves the file.

Bodies are streamed in 64 KiB chunks with ``await resp.write()`` (backpressure), from the
explicit body or from a repeating 1 MiB pseudo-random pattern seeded by ``task_id/index``, so a
generated output of any size costs at most 1 MiB of memory.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import random
import secrets
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import anyio
import anyio.lowlevel
import msgspec
from aiohttp import web
from yarl import URL

PATTERN_BYTES = 1 << 20
CHUNK_BYTES = 64 * 1024
CONTENT_TYPE = "video/mp4"
# How long runner.cleanup() lets in-flight handlers (stalls, endless bodies) run before
# cancelling them, and the bound on the whole shutdown.
SHUTDOWN_TIMEOUT_SECONDS = 1.0
CLEANUP_BOUND_SECONDS = 5.0
DRIP_TICKS_PER_SECOND = 20


class Faults(msgspec.Struct, frozen=True, kw_only=True):
    """What goes wrong with one output's downloads.

    The "first N" counters are per output and consecutive, in this order: ``not_ready``,
    then ``throttle``, then ``error`` (so ``not_ready_requests=1, error_requests=2`` answers
    404, 503, 503, then the file). Streaming faults count bytes on the wire (compressed bytes
    when ``gzip``).
    """

    not_ready_requests: int = 0
    """The first N download requests answer 404 ``{"error": "not_ready"}``."""
    expired: bool = False
    """Every download answers 403 ``{"error": "expired"}``, whatever the signature says."""
    throttle_requests: int = 0
    """The next N download requests answer 429 with ``Retry-After``."""
    retry_after_seconds: float = 1
    """The ``Retry-After`` value (formatted with ``:g``, so ``0.2`` stays fractional)."""
    error_requests: int = 0
    """The next N download requests answer 503 ``{"error": "unavailable"}``."""
    truncate_at_bytes: int | None = None
    """Announce the full Content-Length, close the connection after this many bytes."""
    truncate_requests: int = 0
    """With ``truncate_at_bytes``: cut only the first N bodies (0: every one). A resume's
    body is cut after that many bytes of its own."""
    ignore_range: bool = False
    """Answer ``Range`` requests with the whole body (200), as origins without range
    support do (still with an ETag, without ``Accept-Ranges``)."""
    drip_bytes_per_second: int | None = None
    """Send the body in small chunks paced at this rate."""
    stall_after_bytes: int | None = None
    """Send this many bytes, then nothing, without closing, until the client goes away."""
    advertise_wrong_sha256: bool = False
    """The task API reports a checksum that the body does not have."""
    redirect_hops: int = 0
    """Answer 302 through N ``/r/...`` hops on the same host; the last hop serves the file."""
    redirect_to: str | None = None
    """Answer 302 to this absolute URL (an internal or ``http://`` target, say)."""
    endless: bool = False
    """A body that never ends, without Content-Length (the pattern, repeated)."""
    gzip: bool = False
    """Send the body gzip-compressed with ``Content-Encoding: gzip`` (chunked)."""
    omit_content_length: bool = False
    """Chunked transfer instead of a Content-Length."""
    gone: bool = False
    """The task API still lists the output, but refresh answers 410 and download 404."""
    cross_host_redirect: str | None = None
    """Answer 302 to the same path and query on another host: a host name (same scheme and
    port, e.g. ``cdn2.provider.test``) or an origin such as ``https://cdn2.provider.test:8443``.
    A request that already arrives for that host is served (hops and body)."""


class _Output:
    """One output: its bytes (explicit or a pattern), checksum, faults and attempt count."""

    __slots__ = ("attempts", "bodies", "data", "faults", "index", "sha256", "size", "task_id")

    def __init__(self, task_id: str, index: int, data: bytes, size: int, faults: Faults) -> None:
        self.task_id = task_id
        self.index = index
        self.data = data
        self.size = size
        self.faults = faults
        self.attempts = 0
        self.bodies = 0  # bodies begun (for ``truncate_requests``)
        digest = hashlib.sha256()
        for chunk in self.chunks(0, size):
            digest.update(chunk)
        self.sha256 = digest.hexdigest()

    @property
    def advertised_sha256(self) -> str:
        if self.faults.advertise_wrong_sha256:
            return hashlib.sha256(b"wrong:" + self.sha256.encode()).hexdigest()
        return self.sha256

    def chunks(self, start: int, end: int) -> Iterator[memoryview]:
        """Bytes ``[start, end)`` of the output, at most CHUNK_BYTES at a time."""
        view = memoryview(self.data)
        period = len(self.data)
        pos = start
        while pos < end:
            offset = pos % period
            n = min(CHUNK_BYTES, period - offset, end - pos)
            yield view[offset : offset + n]
            pos += n

    def endless_chunks(self) -> Iterator[memoryview]:
        view = memoryview(self.data or _pattern("endless"))
        while True:
            for offset in range(0, len(view), CHUNK_BYTES):
                yield view[offset : offset + CHUNK_BYTES]


def _pattern(seed: str) -> bytes:
    return random.Random(seed).randbytes(PATTERN_BYTES)


def _gzipped(chunks: Iterator[memoryview]) -> Iterator[memoryview]:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: gzip container
    for chunk in chunks:
        out = compressor.compress(chunk)
        if out:
            yield memoryview(out)
    yield memoryview(compressor.flush())


def _iso_utc(unix: int) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _error(status: int, code: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": code}, status=status, headers=headers)


def _redirect(location: str) -> web.Response:
    return web.Response(status=302, headers={"Location": location})


class _Unsatisfiable(Exception):
    pass


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end)`` for one ``bytes=`` range, None to serve the whole body.

    Malformed or multi-range headers are ignored (whole body); a range starting past the end
    raises _Unsatisfiable.
    """
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, sep, last = header[len("bytes=") :].strip().partition("-")
    if not sep:
        return None
    try:
        if not first:
            suffix = int(last)
            if suffix <= 0 or size == 0:
                raise _Unsatisfiable
            return max(0, size - suffix), size
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start >= size:
        raise _Unsatisfiable
    if end <= start:
        return None
    return start, min(end, size)


class SimulatedProvider:
    """The provider's state and routes; run it with :func:`open_simulated_provider`."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None,
        host: str = "127.0.0.1",
        port: int = 0,
        public_host: str = "localhost",
        signing_key: bytes | None = None,
        url_ttl_seconds: float = 3600,
    ) -> None:
        self.ssl_context = ssl_context
        self.host = host
        self.port = port
        self.public_host = public_host
        self.signing_key = signing_key if signing_key is not None else secrets.token_bytes(32)
        self.url_ttl_seconds = url_ttl_seconds
        self.requests: collections.Counter[str] = collections.Counter()
        self.seen_headers: list[dict[str, str]] = []
        self._tasks: dict[str, dict[int, _Output]] = {}
        self._runner: web.AppRunner | None = None

    # -- state ------------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    @property
    def base_url(self) -> str:
        """``scheme://public_host:port``; the port is known once the server runs."""
        if not self.port:
            raise RuntimeError("the simulated provider has no port yet: start it first")
        return f"{self.scheme}://{_netloc(self.public_host, self.port)}"

    def add_output(
        self,
        task_id: str,
        index: int,
        body: bytes | None = None,
        *,
        size: int | None = None,
        faults: Faults = Faults(),  # noqa: B008  (frozen, so sharing the default is safe)
    ) -> None:
        """Add (or replace, resetting its counters) one output of a task.

        Give ``body``, or ``size`` for that many deterministic bytes streamed from a 1 MiB
        pattern; the sha256 is computed here, once.
        """
        if (body is None) == (size is None):
            raise ValueError("give exactly one of body and size")
        if index < 0:
            raise ValueError("index must be >= 0")
        if body is not None:
            output = _Output(task_id, index, bytes(body), len(body), faults)
        else:
            assert size is not None
            if size < 0:
                raise ValueError("size must be >= 0")
            data = _pattern(f"{task_id}/{index}")[: min(size, PATTERN_BYTES)]
            output = _Output(task_id, index, data, size, faults)
        self._tasks.setdefault(task_id, {})[index] = output

    def signed_url(self, task_id: str, index: int, ttl_seconds: float | None = None) -> str:
        """A download URL for the output, valid ``ttl_seconds`` (negative: already expired)."""
        return self._signed(task_id, index, ttl_seconds)[0]

    def task_json(self, task_id: str) -> dict[str, Any]:
        """What ``GET /v1/tasks/{task_id}`` answers; KeyError for an unknown task."""
        outputs = []
        for index, output in sorted(self._tasks[task_id].items()):
            url, exp = self._signed(task_id, index, None)
            outputs.append(
                {
                    "index": index,
                    "url": url,
                    "expires_at": _iso_utc(exp),
                    "sha256": output.advertised_sha256,
                    "size": output.size,
                    "content_type": CONTENT_TYPE,
                }
            )
        return {"id": task_id, "status": "SUCCEEDED", "outputs": outputs}

    def _signature(self, task_id: str, index: int, exp: int) -> str:
        message = f"{task_id}/{index}/{exp}".encode()
        return hmac.new(self.signing_key, message, hashlib.sha256).hexdigest()

    def _signed(self, task_id: str, index: int, ttl_seconds: float | None) -> tuple[str, int]:
        ttl = self.url_ttl_seconds if ttl_seconds is None else ttl_seconds
        exp = int(time.time() + ttl) + (1 if ttl >= 0 else 0)  # never shorter than asked
        sig = self._signature(task_id, index, exp)
        path = f"/files/{quote(task_id, safe='')}/{index}"
        return f"{self.base_url}{path}?exp={exp}&sig={sig}", exp

    # -- server -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and serve; sets ``port`` when it was 0."""
        if self._runner is not None:
            raise RuntimeError("the simulated provider is already running")
        runner = web.AppRunner(
            self._make_app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS,
            handler_cancellation=True,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl_context)
            await site.start()
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_BOUND_SECONDS):
                await runner.cleanup()
            raise
        self._runner = runner
        if runner.addresses:
            self.port = int(runner.addresses[0][1])

    async def aclose(self) -> None:
        """Stop serving (shielded, bounded); in-flight handlers get SHUTDOWN_TIMEOUT_SECONDS."""
        runner, self._runner = self._runner, None
        if runner is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_BOUND_SECONDS):
                await runner.cleanup()

    def _make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/tasks/{task_id}", self._task, allow_head=False)
        app.router.add_post(r"/v1/tasks/{task_id}/outputs/{index:\d+}/refresh", self._refresh)
        app.router.add_get(r"/files/{task_id}/{index:\d+}", self._download, allow_head=False)
        app.router.add_get(
            r"/r/{hop:\d+}/files/{task_id}/{index:\d+}", self._redirect_hop, allow_head=False
        )
        return app

    def _lookup(self, request: web.Request) -> _Output | None:
        outputs = self._tasks.get(request.match_info["task_id"])
        if outputs is None:
            return None
        return outputs.get(int(request.match_info["index"]))

    async def _task(self, request: web.Request) -> web.StreamResponse:
        self.requests["task"] += 1
        task_id = request.match_info["task_id"]
        if task_id not in self._tasks:
            return _error(404, "not_found")
        return web.json_response(self.task_json(task_id))

    async def _refresh(self, request: web.Request) -> web.StreamResponse:
        self.requests["refresh"] += 1
        output = self._lookup(request)
        if output is None:
            return _error(404, "not_found")
        if output.faults.gone:
            return _error(410, "gone")
        url, exp = self._signed(output.task_id, output.index, None)
        return web.json_response({"url": url, "expires_at": _iso_utc(exp)})

    def _authorize(self, request: web.Request) -> tuple[_Output | None, web.Response | None]:
        output = self._lookup(request)
        if output is None:
            return None, _error(404, "not_found")
        exp_text = request.query.get("exp", "")
        sig = request.query.get("sig", "")
        try:
            exp = int(exp_text)
        except ValueError:
            return None, _error(403, "bad_signature")
        expected = self._signature(output.task_id, output.index, exp)
        if not hmac.compare_digest(expected, sig):
            return None, _error(403, "bad_signature")
        if exp < time.time():
            return None, _error(403, "expired")
        return output, None

    async def _download(self, request: web.Request) -> web.StreamResponse:
        self.requests["download"] += 1
        self.seen_headers.append(dict(request.headers))
        output, refusal = self._authorize(request)
        if output is None:
            assert refusal is not None
            return refusal
        faults = output.faults
        if faults.expired:
            return _error(403, "expired")
        if faults.gone:
            return _error(404, "gone")
        output.attempts += 1
        attempt = output.attempts
        if attempt <= faults.not_ready_requests:
            return _error(404, "not_ready")
        attempt -= faults.not_ready_requests
        if attempt <= faults.throttle_requests:
            retry_after = f"{faults.retry_after_seconds:g}"
            return _error(429, "throttled", {"Retry-After": retry_after})
        attempt -= faults.throttle_requests
        if attempt <= faults.error_requests:
            return _error(503, "unavailable")
        if faults.redirect_to is not None:
            return _redirect(faults.redirect_to)
        if faults.cross_host_redirect is not None:
            target = self._cross_host_origin(faults.cross_host_redirect)
            if request.url.host != target.host:
                return _redirect(f"{str(target).rstrip('/')}{request.path_qs}")
        if faults.redirect_hops > 0:
            return _redirect(self._hop_url(request, 1))
        return await self._send_body(request, output)

    async def _redirect_hop(self, request: web.Request) -> web.StreamResponse:
        self.requests["redirect"] += 1
        self.seen_headers.append(dict(request.headers))
        output, refusal = self._authorize(request)
        if output is None:
            assert refusal is not None
            return refusal
        hop = int(request.match_info["hop"])
        if hop < output.faults.redirect_hops:
            return _redirect(self._hop_url(request, hop + 1))
        return await self._send_body(request, output)

    def _cross_host_origin(self, value: str) -> URL:
        if "://" in value:
            return URL(value).origin()
        return URL(f"{self.scheme}://{_netloc(value, self.port)}")

    def _hop_url(self, request: web.Request, hop: int) -> str:
        task_id = quote(request.match_info["task_id"], safe="")
        index = request.match_info["index"]
        query = request.query_string
        return f"{request.scheme}://{request.host}/r/{hop}/files/{task_id}/{index}?{query}"

    async def _send_body(self, request: web.Request, output: _Output) -> web.StreamResponse:
        faults = output.faults
        resp = web.StreamResponse(status=200)
        resp.content_type = CONTENT_TYPE
        length: int | None
        if faults.endless:
            chunks = output.endless_chunks()
            length = None
        else:
            start, end = 0, output.size
            ranged = None
            if not faults.gzip:
                resp.headers["ETag"] = f'"{output.sha256}"'
                if not faults.ignore_range:
                    resp.headers["Accept-Ranges"] = "bytes"
                if_range = request.headers.get("If-Range")
                if not faults.ignore_range and if_range in (None, resp.headers["ETag"]):
                    try:
                        ranged = _parse_range(request.headers.get("Range"), output.size)
                    except _Unsatisfiable:
                        return web.Response(
                            status=416, headers={"Content-Range": f"bytes */{output.size}"}
                        )
            if ranged is not None:
                start, end = ranged
                resp.set_status(206)
                resp.headers["Content-Range"] = f"bytes {start}-{end - 1}/{output.size}"
            chunks = output.chunks(start, end)
            length = end - start
        if faults.gzip:
            resp.headers["Content-Encoding"] = "gzip"
            chunks = _gzipped(chunks)
            length = None
        if length is not None and not faults.omit_content_length:
            resp.content_length = length
        else:
            resp.enable_chunked_encoding()
        truncate_at = faults.truncate_at_bytes
        if truncate_at is not None and faults.truncate_requests:
            output.bodies += 1
            if output.bodies > faults.truncate_requests:
                truncate_at = None
        if truncate_at is not None:
            resp.force_close()

        limits = [n for n in (truncate_at, faults.stall_after_bytes) if n is not None]
        limit = min(limits) if limits else None
        try:
            await resp.prepare(request)
            sent = 0
            for chunk in chunks:
                if limit is not None and sent + len(chunk) >= limit:
                    await self._write(resp, chunk[: limit - sent], faults.drip_bytes_per_second)
                    sent = limit
                    break
                await self._write(resp, chunk, faults.drip_bytes_per_second)
                sent += len(chunk)
            else:
                await resp.write_eof()
                return resp
            if limit == truncate_at:
                # Flushes what was written, then closes: short of the announced length.
                if request.transport is not None:
                    request.transport.close()
                return resp
            # Stall: handler_cancellation cancels us when the client goes away, and
            # runner.cleanup() after SHUTDOWN_TIMEOUT_SECONDS.
            await anyio.sleep_forever()
        except ConnectionError:
            pass  # the client went away: that is its right
        return resp

    @staticmethod
    async def _write(resp: web.StreamResponse, data: memoryview, rate: int | None) -> None:
        if not data:
            return
        if rate is None:
            await resp.write(data)
            # resp.write() only yields when the transport's buffer is full, and a transport
            # whose peer is gone swallows writes without buffering them: without this
            # checkpoint an endless body would spin forever before connection_lost (which
            # cancels this handler) could ever run.
            await anyio.lowlevel.checkpoint()
            return
        step = max(1, rate // DRIP_TICKS_PER_SECOND)
        for offset in range(0, len(data), step):
            piece = data[offset : offset + step]
            await resp.write(piece)
            await anyio.sleep(len(piece) / rate)


@asynccontextmanager
async def open_simulated_provider(**kwargs: Any) -> AsyncIterator[SimulatedProvider]:
    """A started :class:`SimulatedProvider` (keyword arguments as its constructor's;
    ``factory`` a subclass to start instead, e.g. a simulated vendor).

    ``ssl_context`` defaults to None (plain HTTP); ``port`` 0 picks a free one. Shut down on
    exit, shielded and bounded.
    """
    kwargs.setdefault("ssl_context", None)
    factory = kwargs.pop("factory", SimulatedProvider)
    provider = factory(**kwargs)
    await provider.start()
    try:
        yield provider
    finally:
        await provider.aclose()
