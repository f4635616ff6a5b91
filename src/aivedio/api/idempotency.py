"""``Idempotency-Key`` on the POSTs that create something (``POST /v1/videos``,
``POST /v1/generation-tasks``), as Stripe, Mux and Cloudflare clients send it.

A client that did not see the answer (a timeout, a dropped connection) sends the request
again with the same key. Within ``[api] idempotency_ttl_seconds`` (24 h by default):

* the same key, the same request (method, route and body bytes): the first answer again,
  byte for byte, with ``Idempotent-Replayed: true``: the same video id and upload URLs,
  never a second session;
* the same key, another request: 422 ``idempotency_key_reused``;
* the same key while the first request still runs: 409 ``idempotency_key_in_use`` with
  ``Retry-After``.

Only a 2xx answer is kept. A request that was refused (4xx) created nothing, and one that
failed (5xx, an exception, a dropped connection) may be tried again: the key is released at
once. A running request renews its lock, so a slow one keeps its key; one whose process
died frees it when the lock lapses (``idempotency_lock_seconds``), and only the request that
holds the key (its holder id) may complete or release it. Keys are per tenant; the rows live in
``store/idempotency_keys.py`` and the sweeper deletes the expired ones. Without the header
nothing changes.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Awaitable, Callable

import anyio
from aiohttp import web

from aivedio.api.auth import tenant_of
from aivedio.api.context import context
from aivedio.api.problems import ApiError
from aivedio.store import idempotency_keys
from aivedio.store.database import Pool

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
# Printable ASCII without spaces, as the IETF draft's keys and every client library's UUIDs.
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
SETTLE_TIMEOUT_SECONDS = 5.0


def request_digest(request: web.Request, body: bytes) -> bytes:
    """What makes two requests the same: method, route (its template) and body bytes."""
    route = request.match_info.route.resource
    template = route.canonical if route is not None else request.path
    digest = hashlib.sha256(f"{request.method}\n{template}\n{request.path}\n".encode())
    digest.update(body)
    return digest.digest()


async def idempotent(
    request: web.Request, body: bytes, run: Callable[[], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """``run`` once per (tenant, ``Idempotency-Key``); see the module docstring."""
    key = request.headers.get(HEADER)
    if key is None:
        return await run()
    if not _KEY.fullmatch(key):
        raise ApiError(
            400,
            f"{HEADER} must be 1 to 255 printable ASCII characters without spaces",
            "invalid_idempotency_key",
        )
    ctx = context(request)
    api = ctx.config.api
    tenant_id = tenant_of(request)
    digest = request_digest(request, body)
    holder = uuid.uuid4()
    held = None
    for _ in range(3):  # None: the key expired and was deleted between two statements
        held = await idempotency_keys.take(
            ctx.pool,
            tenant_id,
            key,
            digest,
            holder=holder,
            lock_seconds=api.idempotency_lock_seconds,
            ttl_seconds=api.idempotency_ttl_seconds,
        )
        if held is not None:
            break
    if held is None:
        raise ApiError(409, f"the {HEADER} is changing hands; retry", "idempotency_key_in_use")
    if not held.taken:
        return _answer_held(held, digest)
    response: web.StreamResponse | None = None
    failure: Exception | None = None
    try:
        async with anyio.create_task_group() as group:
            # The lock is renewed while the request runs: only a request whose process died
            # lets its key be taken over (a slow one keeps it).
            group.start_soon(_renew, ctx.pool, tenant_id, key, holder, api.idempotency_lock_seconds)
            try:
                response = await run()
            except Exception as exc:  # re-raised as itself below, not in a group
                failure = exc
            group.cancel_scope.cancel()
    finally:
        # Shielded and bounded: a client gone mid-request still settles its key (else the
        # lock lapses and the key is free then).
        with anyio.move_on_after(SETTLE_TIMEOUT_SECONDS, shield=True):
            ok = isinstance(response, web.Response) and 200 <= response.status < 300
            if ok:
                assert isinstance(response, web.Response) and isinstance(response.body, bytes)
                await idempotency_keys.complete(
                    ctx.pool,
                    tenant_id,
                    key,
                    holder,
                    response.status,
                    response.body,
                    response.content_type,
                    response.headers.get("Location"),
                )
            else:
                # Refused or failed: nothing was created that a retry could duplicate.
                await idempotency_keys.release(ctx.pool, tenant_id, key, holder)
    if failure is not None:
        raise failure
    assert response is not None
    return response


def _answer_held(held: idempotency_keys.Held, digest: bytes) -> web.Response:
    """What a request answers when another holds its key, or answered it already."""
    if held.request_sha256 != digest:
        raise ApiError(
            422,
            f"this {HEADER} was used with another request (method, path or body)",
            "idempotency_key_reused",
        )
    if held.status is None or held.response is None:
        raise ApiError(
            409,
            f"a request with this {HEADER} is still running; retry",
            "idempotency_key_in_use",
            headers={"Retry-After": "1"},
        )
    headers = {REPLAYED: "true"} | ({"Location": held.location} if held.location else {})
    return web.Response(
        status=held.status,
        body=held.response,
        content_type=held.content_type or "application/json",
        headers=headers,
    )


async def _renew(pool: Pool, tenant_id: int, key: str, holder: uuid.UUID, lock: float) -> None:
    while True:
        await anyio.sleep(lock / 3)
        await idempotency_keys.renew(pool, tenant_id, key, holder, lock)
