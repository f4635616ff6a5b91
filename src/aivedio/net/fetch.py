"""The guarded streaming GET: an untrusted URL to a sink, bounded in every dimension.

What each rule prevents:

* The full policy (``check_url``) runs on the URL and on every redirect hop, and redirects are
  followed by hand: a public URL that 302s to ``http://169.254.169.254/`` is refused before a
  byte is sent. At most ``max_redirects`` hops.
* Headers given by the caller (a provider's ``Authorization``, an API key under any name) go
  to the first origin only and are all dropped on any cross-origin hop, so a redirect cannot
  exfiltrate a credential. Cookies are
  never kept (``DummyCookieJar``) and the environment's proxies are ignored (``trust_env``).
* ``Accept-Encoding: identity`` and a refusal of any encoded body: a byte cap and a checksum
  mean something only over the bytes on the wire; a gzip bomb is never inflated.
* Deadlines: connect, response headers, idle read (no byte for N seconds), and total.
* ``Content-Length`` over the cap is refused before reading; without one, reading stops at
  cap + 1 byte. The body goes chunk by chunk through a counter and SHA-256 into the sink; the
  sink's ``await`` is the backpressure: when the store is slow we read the socket slower.

Errors are classified here (errors.py) and never carry the URL: scheme, host and a hash only.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from urllib.parse import urljoin

import aiohttp
import anyio
import msgspec

from aivedio import untrusted
from aivedio.errors import (
    AivedioError,
    InvalidResponseError,
    MalformedInputError,
    NotYetAvailableError,
    PolicyBlockedError,
    ProviderServerError,
    ThrottledError,
    TooLargeError,
    TransientError,
    UrlExpiredError,
)
from aivedio.logs import url_for_log
from aivedio.net.policy import FetchPolicy, Target, check_url
from aivedio.net.resolver import PinningResolver, guarded_socket_factory
from aivedio.transfer_cpu import measured

Sink = Callable[[bytes], Awaitable[None]]


class FetchLimits(msgspec.Struct, frozen=True, kw_only=True):
    max_bytes: int = 4 * 1024**3
    connect_timeout_seconds: float = 10.0
    header_timeout_seconds: float = 30.0
    idle_read_timeout_seconds: float = 30.0
    total_timeout_seconds: float = 3600.0
    per_host_connections: int = 8


class FetchResult(msgspec.Struct, frozen=True, kw_only=True):
    url: str  # for logs: scheme, host, port and a path hash
    status: int
    bytes: int
    sha256: str
    content_length: int | None
    content_type: str | None
    addresses: list[str]
    redirects: list[str]  # hosts of each hop after the first


class FetchError(msgspec.Struct, frozen=True):
    """What a failed fetch knew when it failed (for the CLI and attempt records)."""

    addresses: list[str]
    redirects: list[str]
    bytes: int


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        from datetime import UTC, datetime

        return max(0.0, (when - datetime.now(UTC)).total_seconds())


def classify_status(status: int, url: str, retry_after: str | None) -> AivedioError:
    error = _classify_status(status, url, retry_after)
    error.http_status = status
    return error


def _classify_status(status: int, url: str, retry_after: str | None) -> AivedioError:
    where = url_for_log(url)
    if status == 404:
        return NotYetAvailableError(f"404 from {where}")
    if status in (401, 403, 410):
        return UrlExpiredError(f"{status} from {where}: signature expired or refused")
    if status == 429:
        return ThrottledError(f"429 from {where}", retry_after_seconds=_retry_after(retry_after))
    if status >= 500:
        return ProviderServerError(
            f"{status} from {where}", retry_after_seconds=_retry_after(retry_after)
        )
    return InvalidResponseError(f"unexpected status {status} from {where}")


def _origin(target: Target) -> tuple[str, str, int]:
    return (target.scheme, target.host, target.port)


class Fetcher:
    """One connection pool and resolver for many fetches under one policy."""

    def __init__(
        self,
        policy: FetchPolicy,
        limits: FetchLimits,
        *,
        nameservers: Sequence[str] = (),
        ssl_context: ssl.SSLContext | None = None,
        user_agent: str = "aivedio-fetch/1",
    ) -> None:
        self.policy = policy
        self.limits = limits
        self.resolver = PinningResolver(policy, nameservers)
        self._ssl = ssl_context or ssl.create_default_context()
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=self.resolver,
                use_dns_cache=False,
                limit=0,
                limit_per_host=self.limits.per_host_connections,
                ssl=self._ssl,
                socket_factory=guarded_socket_factory(self.policy),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self.limits.connect_timeout_seconds,
                    sock_read=self.limits.idle_read_timeout_seconds,
                ),
                read_bufsize=256 * 1024,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.resolver.close()

    async def check(self, url: str) -> tuple[Target, list[str]]:
        """The whole policy without connecting: the URL, then every DNS answer."""
        target = check_url(url, self.policy)
        if target.ip_literal:
            return target, [target.host]
        return target, await self.resolver.lookup(target.host)

    async def stream(
        self,
        url: str,
        sink: Sink,
        *,
        headers: Mapping[str, str] | None = None,
        max_bytes: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> FetchResult:
        """GET ``url`` into ``sink``. Raises the classified AivedioError on any failure; the
        sink may have received part of the body then (the caller aborts its upload)."""
        cap = min(max_bytes or self.limits.max_bytes, self.limits.max_bytes)
        state = _State()
        try:
            with anyio.fail_after(self.limits.total_timeout_seconds):
                return await self._stream(url, sink, dict(headers or {}), cap, state, progress)
        except TimeoutError:
            raise TransientError(
                f"total deadline of {self.limits.total_timeout_seconds:g}s exceeded "
                f"for {url_for_log(url)} after {state.received} bytes"
            ) from None
        except AivedioError as exc:
            exc.fetch_state = FetchError(state.addresses, state.redirects, state.received)  # type: ignore[attr-defined]
            raise

    async def _stream(
        self,
        url: str,
        sink: Sink,
        headers: dict[str, str],
        cap: int,
        state: _State,
        progress: Callable[[int], None] | None,
    ) -> FetchResult:
        first = check_url(url, self.policy)
        current, target = url, first
        for hop in range(self.policy.max_redirects + 1):
            if hop:
                target = check_url(current, self.policy)
                state.redirects.append(target.host)
            send = {"Accept-Encoding": "identity", "User-Agent": self._user_agent}
            if _origin(target) == _origin(first):
                # The caller's headers (a provider's credentials, whatever their name) go to
                # the first origin only; any other origin gets none of them.
                send.update(headers)
            response = await self._request(current, send)
            state.addresses = (
                [target.host] if target.ip_literal else self.resolver.answers.get(target.host, [])
            )
            try:
                if response.status in (301, 302, 303, 307, 308):
                    location = response.headers.get("Location")
                    if not location:
                        raise InvalidResponseError(
                            f"redirect without Location from {url_for_log(current)}"
                        )
                    current = urljoin(current, location)
                    continue
                if response.status != 200:
                    raise classify_status(
                        response.status, current, response.headers.get("Retry-After")
                    )
                return await self._read_body(current, response, sink, cap, state, progress)
            finally:
                response.release()
        raise PolicyBlockedError(
            f"too_many_redirects: more than {self.policy.max_redirects} hops from "
            f"{url_for_log(url)}"
        )

    async def fetch_json(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        json_body: object = None,
        max_bytes: int = 1024 * 1024,
    ) -> object:
        """A small JSON API call (a provider's task or refresh endpoint) under the same policy,
        deadlines and classification. Redirects are not followed for API calls."""
        check_url(url, self.policy)
        send = {
            "Accept-Encoding": "identity",
            "User-Agent": self._user_agent,
            "Accept": "application/json",
            **(headers or {}),
        }
        data = None
        if json_body is not None:
            data = msgspec.json.encode(json_body)
            send["Content-Type"] = "application/json"
        buffer = bytearray()

        async def collect(chunk: bytes) -> None:
            buffer.extend(chunk)

        with anyio.fail_after(self.limits.total_timeout_seconds):
            response = await self._request(url, send, method=method, data=data)
            try:
                if response.status != 200:
                    raise classify_status(response.status, url, response.headers.get("Retry-After"))
                await self._read_body(url, response, collect, max_bytes, _State(), None)
            finally:
                response.release()
        try:  # at the edge's bounds: a provider's answer is outside input too
            return untrusted.decode(bytes(buffer), bounds=untrusted.PROVIDER_BOUNDS)
        except MalformedInputError as exc:
            raise MalformedInputError(
                f"{url_for_log(url)} answered {exc.detail}", field=exc.field, reason=exc.reason
            ) from None

    async def _request(
        self, url: str, headers: dict[str, str], *, method: str = "GET", data: bytes | None = None
    ) -> aiohttp.ClientResponse:
        try:
            with anyio.fail_after(
                self.limits.connect_timeout_seconds + self.limits.header_timeout_seconds
            ):
                return await self._client().request(
                    method, url, headers=headers, data=data, allow_redirects=False
                )
        except TimeoutError:
            raise TransientError(f"no response headers from {url_for_log(url)} in time") from None
        except aiohttp.ClientConnectorError as exc:
            raise TransientError(f"cannot connect to {url_for_log(url)}: {exc.strerror}") from None
        except aiohttp.ClientError as exc:
            raise TransientError(
                f"request to {url_for_log(url)} failed: {type(exc).__name__}"
            ) from None

    async def _read_body(
        self,
        url: str,
        response: aiohttp.ClientResponse,
        sink: Sink,
        cap: int,
        state: _State,
        progress: Callable[[int], None] | None,
    ) -> FetchResult:
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise InvalidResponseError(
                f"encoded body ({encoding}) from {url_for_log(url)} refused; never inflated"
            )
        length = response.content_length
        if length is not None and length > cap:
            raise TooLargeError(f"Content-Length {length} exceeds the cap of {cap} bytes")
        hasher = hashlib.sha256()
        try:
            while True:
                # One received chunk at a time, as aiohttp's parser made it: ``readany`` would
                # join what is buffered into a new object (a copy, and a page fault a page
                # once that reaches glibc's mmap threshold).
                chunk, end_of_http_chunk = await response.content.readchunk()
                if not chunk:
                    if end_of_http_chunk:
                        continue  # the end of a chunk of a chunked body, not of the body
                    break
                state.received += len(chunk)
                if state.received > cap:
                    raise TooLargeError(f"body exceeds the cap of {cap} bytes")
                with measured("fetch"):
                    hasher.update(chunk)
                await sink(chunk)
                if progress is not None:
                    progress(state.received)
        except aiohttp.ClientPayloadError:
            raise TransientError(
                f"body from {url_for_log(url)} truncated after {state.received} bytes"
            ) from None
        except (aiohttp.ServerTimeoutError, TimeoutError):
            raise TransientError(
                f"idle read deadline: no data from {url_for_log(url)} for "
                f"{self.limits.idle_read_timeout_seconds:g}s after {state.received} bytes"
            ) from None
        except aiohttp.ClientError as exc:
            raise TransientError(
                f"reading {url_for_log(url)} failed: {type(exc).__name__}"
            ) from None
        if length is not None and state.received != length:
            raise TransientError(
                f"body from {url_for_log(url)} truncated: {state.received} of {length} bytes"
            )
        return FetchResult(
            url=url_for_log(url),
            status=response.status,
            bytes=state.received,
            sha256=hasher.hexdigest(),
            content_length=length,
            content_type=response.headers.get("Content-Type"),
            addresses=state.addresses,
            redirects=state.redirects,
        )


class _State:
    def __init__(self) -> None:
        self.received = 0
        self.addresses: list[str] = []
        self.redirects: list[str] = []
