"""Vendor callbacks on ``POST /v1/providers/{provider}/callbacks``, by the adapter's scheme.

* ``standard_webhooks`` (Replicate, Gemini API): ``webhook-id``/``-timestamp``/``-signature``
  verified against ``webhook_secret`` and any ``extra_webhook_secrets`` (Gemini's
  per-request webhooks, a secret being rotated in; 401 otherwise); the ``webhook-id`` is
  accepted once.
* ``openrouter_hmac`` (OpenRouter): ``X-OpenRouter-Signature: t=…,v1=…`` against the same
  secrets; the body's ``<job_id>-<status>`` is the event id, accepted once.
* ``fal_ed25519`` (fal, Pika): ED25519 over fal's message against the JWKS, from
  ``jwks`` or fetched from ``jwks_url`` through the guarded fetcher and cached for
  ``jwks_cache_seconds`` (fetched again once, at most every minute, when no key matches: a
  rotation); the request id is accepted once.
* ``minimax_challenge``: a ``{"challenge": …}`` body is echoed at once (MiniMax wants it in
  3 s); any other body is unsigned.
* ``unsigned`` (Luma, Kling, MiniMax, Seedance): nothing to verify, so nothing in the body
  is trusted.

A provider whose vendor shut its API down (OpenAI video, 2026-09-24) answers 410
``provider_shut_down`` naming the date, before anything else is looked at.

A verified body that carries its outputs (Replicate, fal, OpenRouter) is recorded at once by
``intake.record_task_outputs``, the function the poller uses, when the signature proves our
account sent it (Replicate's ``whsec_`` secret is the account's) or the task is one we know:
fal signs every fal customer's webhooks with the same JWKS, so anyone can have fal sign a
body naming a request of their own, with outputs of their choosing, and post it here.
Anything else (an unsigned body, Gemini's ``video.generated``, which we confirm by reading
the operation, or a fal body for a task we never saw) is a hint: the task is watched and
its poll made due now, and the poller reads the task from the provider with our key before
anything is recorded.
Nothing is downloaded here; the answer takes milliseconds.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import anyio
import msgspec
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aivedio import untrusted
from aivedio.api import schema
from aivedio.api.context import ApiContext
from aivedio.api.problems import ApiError
from aivedio.config.load import ProviderConfig
from aivedio.errors import AivedioError, ConfigError, MalformedInputError, PolicyBlockedError
from aivedio.logs import get_logger
from aivedio.pipeline.intake import Received, receive, record_task_outputs
from aivedio.pipeline.poller import can_poll, register_watch
from aivedio.providers import (
    VENDORS,
    check_open,
    fal_webhooks,
    openrouter_webhooks,
    standard_webhooks,
)
from aivedio.providers.base import CallbackHint
from aivedio.providers.hmac_callbacks import CallbackRejected
from aivedio.providers.seam import ProviderTask, check_reported
from aivedio.store.database import Connection, acquired, transaction

log = get_logger("aivedio.api.callbacks")
JWKS_REFETCH_SECONDS = 60.0


class VendorCallbackAccepted(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    status: str
    event_id: str | None
    generation_task_id: uuid.UUID | None
    # "recorded": a verified body's outputs were recorded; "task_read": the task will be
    # read from the provider before anything is recorded.
    outcome: str
    outputs: int


MAX_CHALLENGE_CHARS = 1024


def challenge_of(body: bytes) -> str | None:
    """The handshake's token: a body that is exactly ``{"challenge": "<printable text>"}``.
    It is echoed unauthenticated on our origin, so anything else is not echoed."""
    try:
        doc = untrusted.decode(body)
    except MalformedInputError:
        return None
    if not isinstance(doc, dict) or len(doc) != 1:
        return None
    challenge = doc.get("challenge")
    if (
        isinstance(challenge, str)
        and 0 < len(challenge) <= MAX_CHALLENGE_CHARS
        and challenge.isprintable()
    ):
        return challenge
    return None


class _JwksCache:
    """Ed25519 keys by JWKS URL (public documents, so one cache per process is right).

    One fetch at a time (a burst of webhooks after a restart, or of forged ones, fetches once),
    and at most one attempt per ``JWKS_REFETCH_SECONDS`` unless the cache has expired: a
    failed or useless fetch keeps the keys we had rather than asking again on every request."""

    def __init__(self) -> None:
        self._keys: dict[str, list[Ed25519PublicKey]] = {}
        self._tried_at: dict[str, float] = {}  # the last attempt, whatever its outcome
        self._fetched_at: dict[str, float] = {}  # the last attempt that gave keys
        self._lock = anyio.Lock()

    async def keys(
        self, ctx: ApiContext, provider: str, pc: ProviderConfig, *, stale_ok: bool = True
    ) -> list[Ed25519PublicKey]:
        """The keys; ``stale_ok=False`` (no key matched: a rotation?) fetches again unless
        the last attempt was under ``JWKS_REFETCH_SECONDS`` ago."""
        if pc.jwks:
            return fal_webhooks.public_keys(pc.jwks)
        url = pc.jwks_url
        async with self._lock:
            cached = self._keys.get(url)
            now = time.monotonic()
            tried = now - self._tried_at.get(url, -math.inf)
            fresh = now - self._fetched_at.get(url, -math.inf) < pc.jwks_cache_seconds
            if cached is not None and fresh and stale_ok:
                return cached
            if tried < min(JWKS_REFETCH_SECONDS, pc.jwks_cache_seconds):
                if cached is not None:
                    return cached
                raise ApiError(503, "fal JWKS unavailable (tried moments ago)", "jwks_unavailable")
            self._tried_at[url] = now
            try:
                keys = await self._fetch(ctx, pc)
            except AivedioError as exc:
                log.warning("jwks_fetch_failed", provider=provider, detail=exc.detail)
                if cached is not None:
                    return cached
                raise ApiError(
                    503, f"fal JWKS unavailable: {exc.detail}", "jwks_unavailable"
                ) from None
            self._keys[url], self._fetched_at[url] = keys, now
        log.info("jwks_fetched", provider=provider, keys=len(keys))
        return keys

    @staticmethod
    async def _fetch(ctx: ApiContext, pc: ProviderConfig) -> list[Ed25519PublicKey]:
        from aivedio.pipeline.services import make_fetcher

        fetcher = make_fetcher(ctx.config.net, pc)
        try:
            raw = await fetcher.fetch_json("GET", pc.jwks_url)
        finally:
            await fetcher.aclose()
        return fal_webhooks.public_keys(msgspec.json.encode(raw))  # ConfigError: no key


JWKS = _JwksCache()


# ``verify``'s answer for a scheme whose body names the delivery (OpenRouter): verified, and
# the event id is the adapter's ``CallbackHint.event_id``.
EVENT_ID_IN_BODY = ""


def configured(pc: ProviderConfig, scheme: str) -> bool:
    if scheme in ("standard_webhooks", "openrouter_hmac"):
        return bool(pc.webhook_secret or pc.extra_webhook_secrets)
    if scheme == "fal_ed25519":
        return bool(pc.jwks or pc.jwks_url)
    return scheme in ("unsigned", "minimax_challenge")


async def verify(
    ctx: ApiContext,
    provider: str,
    pc: ProviderConfig,
    scheme: str,
    request: web.Request,
    body: bytes,
) -> str | None:
    """The event id to accept once (None for unsigned schemes); raises CallbackRejected."""
    tolerance = ctx.config.api.callback_skew_seconds
    secrets = [s for s in (pc.webhook_secret, *pc.extra_webhook_secrets) if s]
    if scheme == "standard_webhooks":
        try:
            hmac_keys = [standard_webhooks.secret_key(secret) for secret in secrets]
        except ConfigError as exc:
            raise ApiError(500, f"providers.{provider}.webhook_secret: {exc.detail}") from None
        return standard_webhooks.verify(
            hmac_keys, request.headers, body, tolerance_seconds=tolerance
        )
    if scheme == "openrouter_hmac":
        raw_keys = [secret.encode() for secret in secrets]
        openrouter_webhooks.verify(raw_keys, request.headers, body, tolerance_seconds=tolerance)
        return EVENT_ID_IN_BODY
    if scheme == "fal_ed25519":
        keys = await JWKS.keys(ctx, provider, pc)
        try:
            return fal_webhooks.verify(keys, request.headers, body, tolerance_seconds=tolerance)
        except CallbackRejected:
            if pc.jwks:
                raise
            fresh = await JWKS.keys(ctx, provider, pc, stale_ok=False)
            if fresh is keys:
                raise
            return fal_webhooks.verify(fresh, request.headers, body, tolerance_seconds=tolerance)
    return None


def parse(pc: ProviderConfig, body: bytes) -> CallbackHint:
    """The body as the vendor's adapter reads it, held to what we store: its task id and
    outputs are values from outside like any other (``check_reported``)."""
    hint = VENDORS[pc.adapter].parse_callback(body, pc)
    check_reported(hint.task_id, hint.outputs)
    return hint


async def record(
    ctx: ApiContext,
    conn: Connection,
    provider: str,
    hint: CallbackHint,
    event_id: str | None,
    received: Received,
) -> VendorCallbackAccepted:
    """Inside the receipt's transaction: record a verified body's outputs, or watch the task."""
    tenant_id, known = received.tenant_id, received.known
    if tenant_id is None:
        raise ApiError(
            422,
            f"task {hint.task_id!r} is unknown and [providers.{provider}] names no tenant",
            "unknown_task",
        )
    adapter = VENDORS[ctx.config.providers[provider].adapter]
    trusted = event_id is not None and (known or adapter.callback_signed_by_account)
    if trusted and hint.status == "SUCCEEDED" and hint.outputs:
        task = ProviderTask(provider_task_id=hint.task_id, status="SUCCEEDED", outputs=hint.outputs)
        try:
            recorded = await record_task_outputs(
                conn,
                queue=ctx.queue,
                cipher=ctx.cipher,
                config=ctx.config,
                provider=provider,
                task=task,
                tenant_id=tenant_id,
                task_known=known,
            )
        except PolicyBlockedError as exc:
            raise ApiError(422, exc.detail, "invalid_output") from None
        return VendorCallbackAccepted(
            task_id=hint.task_id,
            status=hint.status,
            event_id=event_id,
            generation_task_id=recorded[0].generation_task_id,
            outcome="recorded",
            outputs=len(recorded),
        )
    if not can_poll(ctx.config, provider):
        raise ApiError(404, f"provider {provider!r} cannot be asked about its tasks")
    try:
        watch = await register_watch(
            conn,
            queue=ctx.queue,
            config=ctx.config,
            provider=provider,
            provider_task_id=hint.task_id,
            tenant_id=tenant_id,
            hurry=True,
        )
    except PolicyBlockedError as exc:
        raise ApiError(422, exc.detail, exc.detail.partition(":")[0]) from None
    return VendorCallbackAccepted(
        task_id=hint.task_id,
        status=hint.status,
        event_id=event_id,
        generation_task_id=watch.generation_task_id,
        outcome="task_read",
        outputs=0,
    )


async def handle(
    ctx: ApiContext,
    request: web.Request,
    provider: str,
    pc: ProviderConfig,
    scheme: str,
    body: bytes,
    reject: Any,
) -> web.Response:
    """The vendor half of the callback route; ``reject`` counts and logs a refusal."""
    try:
        check_open(provider, pc)
    except PolicyBlockedError as exc:
        raise reject(410, "provider_shut_down", exc.detail) from None
    if scheme == "minimax_challenge":
        challenge = challenge_of(body)
        if challenge is not None:
            ctx.metrics.callbacks.labels(provider, "challenge").inc()
            return web.json_response(
                {"challenge": challenge},
                headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
            )
    try:
        event_id = await verify(ctx, provider, pc, scheme, request, body)
    except CallbackRejected as exc:
        raise reject(401, "bad_signature", exc.detail) from None
    try:
        hint = parse(pc, body)
    except MalformedInputError as exc:
        raise reject(400, "malformed", f"callback body: {exc.detail}", exc.field) from None
    except AivedioError as exc:
        raise reject(400, "malformed", f"callback body: {exc.detail}") from None
    if event_id == EVENT_ID_IN_BODY:
        if not hint.event_id:
            raise reject(400, "malformed", "callback body names no delivery")
        event_id = hint.event_id
    async with acquired(ctx.pool) as conn, transaction(conn):
        # The receipt (when the body has an event id) and the task's tenant: one round trip.
        received = await receive(conn, ctx.config, provider, hint.task_id, event_id)
        if not received.fresh:
            raise reject(
                409,
                "replayed_event",
                f"event {event_id!r} was already received; nothing recorded",
            )
        accepted = await record(ctx, conn, provider, hint, event_id, received)
    ctx.metrics.callbacks.labels(provider, accepted.outcome).inc()
    log.info(
        "callback_accepted",
        provider=provider,
        task_id=hint.task_id,
        event_id=event_id,
        status=hint.status,
        outcome=accepted.outcome,
        outputs=accepted.outputs,
    )
    return schema.encode(accepted, status=202)
