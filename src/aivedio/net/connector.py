"""The fetch's connector: TLS on asyncio's own SSL protocol, whatever the event loop.

Why not the loop's TLS. The worker runs on uvloop, and uvloop's SSL protocol (0.21 to 0.23
at least) loses received plaintext when an origin closes its TCP connection without a TLS
close_notify, which Python's own ``http.server``, some CDNs and proxies do after a complete
``Content-Length`` body. The bytes are lost in the protocol's incoming buffer:

* while the application has paused reading (aiohttp does so whenever its buffer is over its
  high-water mark, i.e. whenever the sink is slower than the wire, which is our
  backpressure), received TLS records are kept *encrypted* in the protocol's incoming BIO,
  to be decrypted on resume;
* uvloop's ``SSLProtocol.eof_received`` treats a TCP FIN before a close_notify as a broken
  connection: it moves straight to SHUTDOWN and closes the transport. Nothing decrypts the
  records still in the BIO (``_do_read`` returns unless WRAPPED), so the tail of a body that
  the peer did send, and that reached us, is never delivered. aiohttp then sees a body short
  of its Content-Length (``ClientPayloadError``): "truncated after N bytes".

asyncio's own ``SSLProtocol`` (Python 3.11+, a port of uvloop's with this case fixed) moves
to FLUSHING instead, keeps the transport open while reading is paused, and on resume
decrypts and delivers what is buffered before it shuts down. Upstream: MagicStack/uvloop
#385 introduced the immediate close, #661 (open) proposes the same fix.

So this connector does not hand ``ssl=`` to ``loop.create_connection``: it opens the plain
TCP connection through aiohttp's own path (happy eyeballs over the pinning resolver's
answers, the guarded socket factory, the connect deadline) with asyncio's ``SSLProtocol`` as
the protocol, the way asyncio's own event loop layers TLS over a socket. SNI and the
certificate check use the same context and host name aiohttp would have given the loop. The
TCP transport is still the loop's (uvloop's): only the TLS state machine is asyncio's.

It overrides one private hook of aiohttp's ``TCPConnector`` (``_wrap_create_connection``,
whose keyword arguments aiohttp passes by name); a test asserts that fetch connections carry
asyncio's TLS transport, so an aiohttp upgrade that bypasses the hook fails loudly.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import math
import ssl
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

# What asyncio gives the handshake when the caller gives nothing (seconds).
DEFAULT_HANDSHAKE_TIMEOUT_SECONDS = 60


class AsyncioTlsConnector(aiohttp.TCPConnector):
    """A ``TCPConnector`` whose TLS runs on ``asyncio.sslproto.SSLProtocol``."""

    async def _wrap_create_connection(
        self,
        *args: Any,
        addr_infos: Any,
        req: aiohttp.ClientRequest,
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp's name for it
        client_error: type[Exception] = aiohttp.ClientConnectorError,
        **kwargs: Any,
    ) -> tuple[asyncio.Transport, ResponseHandler]:
        context = kwargs.get("ssl")
        if not isinstance(context, ssl.SSLContext):
            return await super()._wrap_create_connection(
                *args,
                addr_infos=addr_infos,
                req=req,
                timeout=timeout,
                client_error=client_error,
                **kwargs,
            )
        factory, *rest = args
        server_hostname = kwargs.pop("server_hostname", None)
        kwargs["ssl"] = None  # the TCP connection is plain; TLS is layered on it here
        loop = asyncio.get_running_loop()
        app_protocol = factory()
        handshake_done = loop.create_future()
        # Whole seconds (typeshed's type for it); the fetch's own deadlines bound it anyway.
        handshake_timeout = math.ceil(timeout.sock_connect or DEFAULT_HANDSHAKE_TIMEOUT_SECONDS)
        made: list[asyncio.sslproto.SSLProtocol] = []

        def tls_protocol() -> asyncio.sslproto.SSLProtocol:
            # Made only once the TCP connection is: it makes its application transport at
            # once, which must then be closed; a refused connection must leave none behind.
            made.append(
                asyncio.sslproto.SSLProtocol(
                    loop,
                    app_protocol,
                    context,
                    handshake_done,
                    server_side=False,
                    server_hostname=server_hostname,
                    ssl_handshake_timeout=handshake_timeout,
                )
            )
            return made[-1]

        raw, _ = await super()._wrap_create_connection(
            tls_protocol,
            *rest,
            addr_infos=addr_infos,
            req=req,
            timeout=timeout,
            client_error=client_error,
            **kwargs,
        )
        transport = made[-1]._app_transport  # made with the protocol
        assert transport is not None
        try:
            await handshake_done
        except BaseException as exc:
            # As asyncio's own loop does: closing the TLS transport during or after a failed
            # handshake aborts the TCP one.
            transport.close()
            raw.abort()
            if isinstance(exc, ssl.CertificateError):
                raise aiohttp.ClientConnectorCertificateError(req.connection_key, exc) from exc
            if isinstance(exc, ssl.SSLError):
                raise aiohttp.ClientConnectorSSLError(req.connection_key, exc) from exc
            if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
                raise client_error(req.connection_key, exc) from exc
            raise
        return transport, app_protocol
