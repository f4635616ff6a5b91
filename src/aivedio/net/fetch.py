"""The guarded streaming GET: an untrusted URL to a sink, bounded in every dimension.

What each rule prevents:

* The full policy (``check_url``) runs on the URL and on every redirect hop, and redirects are
  followed by hand: a public URL that 302s to ``http://169.254.169.254/`` is refused before a
  byte is sent. At most ``max_redirects`` hops. A ``Location`` is checked as received, before
  ``urljoin`` could strip it clean, and aiohttp is handed only the yarl URL whose scheme, host
  and port match what the policy checked (``client_url``): one reading of every URL.
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
  (``net/body.py`` reads the body; this module makes the requests around it.)
* A body cut short (a dropped connection, a stalled read) resumes with a ``Range`` request
  from the last byte received, guarded by ``If-Range`` (``net/resume.py`` holds the rules that
  prevent splicing two objects): the checksum and the sink go on; a ``200`` starts both over
  through the caller's ``restart``. At most ``max_resumes`` further requests per fetch, each
  through the same policy, pinning and header rules as the first (the same redirect walk
  from the same URL), within the same total deadline.
* TLS runs on asyncio's own SSL protocol (``net/connector.py``): uvloop's loses the received
  tail of a body when the origin closes TCP without a TLS close_notify.

Errors are classified here (errors.py) and never carry the URL: scheme, host and a hash only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from urllib.parse import urljoin

import aiohttp
import anyio
import msgspec
from yarl import URL

from aivedio import untrusted
from aivedio.errors import (
    AivedioError,
    InvalidResponseError,
    MalformedInputError,
    PolicyBlockedError,
    TransientError,
)
from aivedio.logs import get_logger, url_for_log
from aivedio.net.body import BodyInterruptedError as BodyInterruptedError
from aivedio.net.body import FetchProgress, read_body
from aivedio.net.body import FetchResult as FetchResult
from aivedio.net.body import Sink as Sink
from aivedio.net.connector import AsyncioTlsConnector
from aivedio.net.policy import FetchPolicy, Target, check_location, check_url
from aivedio.net.resolver import PinningResolver, guarded_socket_factory
from aivedio.net.resume import judge, range_headers
from aivedio.net.statuses import classify_status

log = get_logger("aivedio.net.fetch")

# The longest wait before a resume, however many came before it.
MAX_RESUME_BACKOFF_SECONDS = 30.0


Restart = Callable[[], Awaitable[None]]


class FetchLimits(msgspec.Struct, frozen=True, kw_only=True):
    max_bytes: int = 4 * 1024**3
    connect_timeout_seconds: float = 10.0
    header_timeout_seconds: float = 30.0
    idle_read_timeout_seconds: float = 30.0
    total_timeout_seconds: float = 3600.0
    per_host_connections: int = 8
    # Further requests for one body after it was cut short (resumes and starts over).
    max_resumes: int = 5
    # The wait before the second resume of a fetch, doubled for each further one (the first
    # goes at once: an origin that closed the connection is usually there to ask again).
    resume_backoff_seconds: float = 1.0


class FetchError(msgspec.Struct, frozen=True):
    """What a failed fetch knew when it failed (for the CLI and attempt records)."""

    addresses: list[str]
    redirects: list[str]
    bytes: int
    resumes: int = 0
    restarts: int = 0


def _origin(target: Target) -> tuple[str, str, int]:
    return (target.scheme, target.host, target.port)


def client_url(url: str, target: Target) -> URL:
    """``url`` as aiohttp reads it (yarl), and only if that reading dials the scheme, host and
    port the policy checked in ``target``; otherwise PolicyBlockedError (``parse_mismatch``).
    A second parser is a second opinion: where the two disagree we refuse, never pick one."""
    try:
        parsed = URL(url)
        seen: tuple[str, str | None, int | None] = (parsed.scheme, parsed.raw_host, parsed.port)
    except (TypeError, ValueError):
        seen = ("", None, None)
    host = seen[1]
    if target.ip_literal and host is not None:
        with contextlib.suppress(ValueError):  # not an address: the comparison below refuses
            host = str(ipaddress.ip_address(host))
    if (seen[0], host, seen[2]) != _origin(target):
        raise PolicyBlockedError(
            f"parse_mismatch: the HTTP client reads the URL for {target.host} differently"
        )
    return parsed


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
            connector = AsyncioTlsConnector(
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
        restart: Restart | None = None,
    ) -> FetchResult:
        """GET ``url`` into ``sink``. Raises the classified AivedioError on any failure; the
        sink may have received part of the body then (the caller aborts its upload).

        A body cut short is resumed where it stopped. Should the origin answer a resume with
        the whole body instead, ``restart`` is awaited before the first byte of it: the sink
        must forget every byte it was given. Without ``restart`` that fetch fails instead.
        """
        cap = min(max_bytes or self.limits.max_bytes, self.limits.max_bytes)
        state = FetchProgress()
        try:
            with anyio.fail_after(self.limits.total_timeout_seconds):
                return await self._transfer(
                    url, sink, dict(headers or {}), cap, state, progress, restart
                )
        except TimeoutError:
            raise TransientError(
                f"total deadline of {self.limits.total_timeout_seconds:g}s exceeded "
                f"for {url_for_log(url)} after {state.received} bytes"
            ) from None
        except AivedioError as exc:
            exc.fetch_state = FetchError(  # type: ignore[attr-defined]
                state.addresses, state.redirects, state.received, state.resumes, state.restarts
            )
            raise

    async def _transfer(
        self,
        url: str,
        sink: Sink,
        headers: dict[str, str],
        cap: int,
        state: FetchProgress,
        progress: Callable[[int], None] | None,
        restart: Restart | None,
    ) -> FetchResult:
        """One body, over as many requests as its interruptions take (within the budget)."""
        while True:
            try:
                result = await self._attempt(url, sink, headers, cap, state, progress, restart)
            except BodyInterruptedError as exc:
                await self._before_resume(url, exc, state)
                continue
            if result is not None:
                return result
            # The answer to a resume was refused: ask again for the whole body, no range.
            if state.requests > self.limits.max_resumes:
                raise TransientError(
                    f"{url_for_log(url)}: no usable answer within {self.limits.max_resumes} resumes"
                )

    async def _before_resume(
        self, url: str, exc: BodyInterruptedError, state: FetchProgress
    ) -> None:
        """Raise ``exc`` unless the body can be resumed; wait the resume's backoff."""
        where = url_for_log(url)
        reason = None
        if not state.started:
            reason = "no_body"
        elif state.validator is None:
            reason = "no_validator"
        elif state.ranges_refused:
            reason = "ranges_refused"
        elif state.requests > self.limits.max_resumes:
            reason = "max_resumes"
        if reason is not None:
            if state.started:
                log.info(
                    "fetch_not_resumed",
                    url=where,
                    reason=reason,
                    offset=state.received,
                    resumes=state.resumes,
                    restarts=state.restarts,
                )
            raise exc
        state.resume = True
        if state.requests > 1:
            delay = self.limits.resume_backoff_seconds * 2 ** (state.requests - 2)
            await anyio.sleep(min(delay, MAX_RESUME_BACKOFF_SECONDS))
        log.info(
            "fetch_resuming",
            url=where,
            offset=state.received,
            total=state.total,
            request=state.requests + 1,
            error=exc.detail,
        )

    async def _attempt(
        self,
        url: str,
        sink: Sink,
        headers: dict[str, str],
        cap: int,
        state: FetchProgress,
        progress: Callable[[int], None] | None,
        restart: Restart | None,
    ) -> FetchResult | None:
        """One request for the body (a resume when ``state.resume``); None: ask again."""
        validator = state.validator if state.resume else None
        extra = range_headers(state.received, validator) if validator is not None else {}
        state.resume = False
        state.requests += 1
        try:
            response = await self._open(url, headers, extra, state)
        except TransientError as exc:
            if state.started:  # the request to resume failed: the transfer is still cut
                raise BodyInterruptedError(exc.detail) from None
            raise
        try:
            if validator is not None:
                verdict = judge(
                    response.status,
                    response.headers,
                    offset=state.received,
                    total=state.total,
                    validator=validator,
                )
                if verdict.action == "continue":
                    state.resumes += 1
                    state.total = verdict.total
                    log.info(
                        "fetch_resumed",
                        url=url_for_log(url),
                        offset=state.received,
                        total=state.total,
                        resumes=state.resumes,
                    )
                    return await read_body(
                        url,
                        response,
                        sink,
                        cap,
                        state,
                        progress,
                        idle_read_timeout_seconds=self.limits.idle_read_timeout_seconds,
                    )
                if verdict.action == "error":
                    raise classify_status(response.status, url, response.headers.get("Retry-After"))
                await self._start_over(url, verdict.reason, state, restart)
                if verdict.action == "refetch":
                    state.ranges_refused = True
                    return None
            elif response.status != 200:
                raise classify_status(response.status, url, response.headers.get("Retry-After"))
            state.begin(response)
            return await read_body(
                url,
                response,
                sink,
                cap,
                state,
                progress,
                idle_read_timeout_seconds=self.limits.idle_read_timeout_seconds,
            )
        finally:
            response.release()

    async def _start_over(
        self, url: str, reason: str, state: FetchProgress, restart: Restart | None
    ) -> None:
        """Forget the body so far (the sink's bytes and the checksum) before byte 0 again."""
        if restart is None:
            raise TransientError(
                f"{url_for_log(url)} answered a resume with {reason}; "
                f"this fetch cannot start over after {state.received} bytes"
            )
        await restart()
        state.restarts += 1
        log.info(
            "fetch_restarted",
            url=url_for_log(url),
            reason=reason,
            discarded=state.received,
            restarts=state.restarts,
        )
        state.forget()

    async def _open(
        self, url: str, headers: dict[str, str], extra: dict[str, str], state: FetchProgress
    ) -> aiohttp.ClientResponse:
        """The first response that is not a redirect, every hop under the whole policy; the
        caller releases it. ``extra`` (a range) goes to every hop, ``headers`` (the caller's,
        credentials maybe) to the first origin only."""
        first = check_url(url, self.policy)
        current, target = url, first
        state.redirects = []
        for hop in range(self.policy.max_redirects + 1):
            if hop:
                target = check_url(current, self.policy)
                state.redirects.append(target.host)
            send = {"Accept-Encoding": "identity", "User-Agent": self._user_agent, **extra}
            if _origin(target) == _origin(first):
                # The caller's headers (a provider's credentials, whatever their name) go to
                # the first origin only; any other origin gets none of them.
                send.update(headers)
            response = await self._request(current, target, send)
            state.addresses = (
                [target.host] if target.ip_literal else self.resolver.answers.get(target.host, [])
            )
            if response.status not in (301, 302, 303, 307, 308):
                return response
            location = response.headers.get("Location")
            response.release()
            if not location:
                raise InvalidResponseError(f"redirect without Location from {url_for_log(current)}")
            check_location(location)  # as received: urljoin would clean it up
            current = urljoin(current, location)
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
        target = check_url(url, self.policy)
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
            response = await self._request(url, target, send, method=method, data=data)
            try:
                if response.status != 200:
                    raise classify_status(response.status, url, response.headers.get("Retry-After"))
                await read_body(
                    url,
                    response,
                    collect,
                    max_bytes,
                    FetchProgress(),
                    None,
                    idle_read_timeout_seconds=self.limits.idle_read_timeout_seconds,
                )
            finally:
                response.release()
        try:  # at the edge's bounds: a provider's answer is outside input too
            return untrusted.decode(bytes(buffer), bounds=untrusted.PROVIDER_BOUNDS)
        except MalformedInputError as exc:
            raise MalformedInputError(
                f"{url_for_log(url)} answered {exc.detail}", field=exc.field, reason=exc.reason
            ) from None

    async def _request(
        self,
        url: str,
        target: Target,
        headers: dict[str, str],
        *,
        method: str = "GET",
        data: bytes | None = None,
    ) -> aiohttp.ClientResponse:
        wire = client_url(url, target)  # aiohttp gets the reading that was checked, no other
        where = url_for_log(url)
        try:
            with anyio.fail_after(
                self.limits.connect_timeout_seconds + self.limits.header_timeout_seconds
            ):
                return await self._client().request(
                    method, wire, headers=headers, data=data, allow_redirects=False
                )
        except TimeoutError:
            raise TransientError(f"no response headers from {where} in time") from None
        except aiohttp.ClientConnectorError as exc:
            raise TransientError(f"cannot connect to {where}: {exc.strerror}") from None
        except aiohttp.ClientError as exc:
            raise TransientError(f"request to {where} failed: {type(exc).__name__}") from None
