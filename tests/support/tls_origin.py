"""A raw HTTPS origin on loopback, scripted per request, that closes like careless servers do.

aiohttp's server (the simulated provider) always ends TLS with a close_notify; this origin is
a blocking ``ssl`` socket server in threads, as Python's own ``http.server`` is, so it can end
a connection with a bare TCP close (``close()`` without ``unwrap()``: no close_notify),
cut a body at an exact byte, ignore ``Range``, change its object between requests or state
a wrong ``Content-Range``. Every response carries ``Connection: close``.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    """How the origin answers one request (the next step of its plan)."""

    cut_after: int | None = None  # send this many body bytes, then a bare TCP close
    ignore_range: bool = False  # answer 200 with the whole body whatever was asked
    content_range_shift: int = 0  # a 206 states a Content-Range this far off the truth
    ignore_if_range: bool = False  # serve the range even when If-Range names another object
    omit_length: bool = False  # no Content-Length: the body ends with the connection
    new_body: bytes | None = None  # the object changes (new bytes, new ETag) before this
    close_notify: bool = False  # end the connection with a TLS close_notify


@dataclass
class Seen:
    """One request as the origin received it."""

    range: str | None
    if_range: str | None
    authorization: str | None
    status: int = 0


@dataclass
class TlsOrigin:
    port: int
    body: bytes
    plan: list[Step]
    etag_validator: bool = True  # send a strong ETag
    last_modified: bool = True  # send Last-Modified
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    version: int = 0  # how often the object changed
    closed: int = 0  # connections the origin has closed

    @property
    def etag(self) -> str:
        return f'"{hashlib.sha256(self.body).hexdigest()[:16]}"'

    @property
    def modified(self) -> str:
        return f"Thu, 01 Jan 2026 00:00:{self.version:02d} GMT"

    def url(self, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}/video.mp4?sig=secret-signature"

    def _next(self) -> Step:
        with self.lock:
            step = self.plan.pop(0) if self.plan else Step()
            if step.new_body is not None:
                self.body = step.new_body
                self.version += 1
            return step

    def _head(self, request: bytes) -> dict[str, str]:
        lines = request.decode("latin-1").split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}

    def serve(self, conn: ssl.SSLSocket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                return
            data += got
        headers = self._head(data.split(b"\r\n\r\n", 1)[0])
        step = self._next()
        body, etag, modified = self.body, self.etag, self.modified
        seen = Seen(headers.get("range"), headers.get("if-range"), headers.get("authorization"))
        self.seen.append(seen)
        start, status = 0, 200
        asked = headers.get("range", "")
        if_range = headers.get("if-range")
        fresh = if_range is None or if_range in (etag, modified) or step.ignore_if_range
        if asked.startswith("bytes=") and asked.endswith("-") and fresh and not step.ignore_range:
            start, status = int(asked[len("bytes=") : -1]), 206
        seen.status = status
        rest = body[start:]
        head = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Partial Content'}"]
        if not step.omit_length:
            head.append(f"Content-Length: {len(rest)}")
        head += ["Content-Type: video/mp4", "Connection: close"]
        head.append("Accept-Ranges: bytes")
        if self.etag_validator:
            head.append(f"ETag: {etag}")
        if self.last_modified:
            head.append(f"Last-Modified: {modified}")
        if status == 206:
            first = start + step.content_range_shift
            head.append(f"Content-Range: bytes {first}-{len(body) - 1}/{len(body)}")
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if step.cut_after is not None:
            rest = rest[: step.cut_after]
        view = memoryview(rest)
        for offset in range(0, len(view), 256 * 1024):
            conn.sendall(view[offset : offset + 256 * 1024])
        if step.close_notify:
            conn.unwrap()


@contextmanager
def tls_origin(
    context: ssl.SSLContext, body: bytes, plan: list[Step] | None = None, **options: bool
) -> Iterator[TlsOrigin]:
    """Serve ``body`` on 127.0.0.1 (a free port) until the block ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    origin = TlsOrigin(int(listener.getsockname()[1]), body, list(plan or []), **options)
    stop = threading.Event()

    def one(raw: socket.socket) -> None:
        raw.settimeout(10)
        try:
            with context.wrap_socket(raw, server_side=True) as conn:
                origin.serve(conn)
                # ``with`` closes the socket without unwrap(): a bare TCP close, no
                # close_notify, as Python's http.server and many origins end a response.
        except (OSError, ssl.SSLError):
            pass  # the client went away or refused us: its right
        finally:
            raw.close()
            with origin.lock:
                origin.closed += 1

    def accept() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=one, args=(raw,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield origin
    finally:
        stop.set()
        thread.join()
        listener.close()
