"""``POST /v1/providers/{provider}/callbacks``: a provider says a task finished.

Vendor adapters verify by their own scheme (``vendor_callbacks.py``: Standard Webhooks,
fal's ED25519, MiniMax's challenge, unsigned hints confirmed by a task read). A generic
provider's callback is ours, below.

Verified before anything is parsed or recorded: the body is read whole (``api/bodies.py``:
every piece, however it arrives, within ``[api] body_read_timeout_seconds``, else 408) up to
``[api] max_callback_bytes`` (413 past it), then signed in one of two schemes under the
provider's ``callback_secret`` (401 otherwise), its timestamp (whole Unix seconds) within
``[api] callback_skew_seconds`` of now (401):

* Standard Webhooks (``providers/standard_webhooks.py``), chosen by a ``webhook-signature``
  header: ``webhook-id``, ``webhook-timestamp``, ``webhook-signature: v1,<base64>`` over
  ``"{id}.{timestamp}.{body}"``, the key being the base64 part of a ``whsec_`` secret or else
  the secret's UTF-8 bytes (our simulator signs so: ``sim/callbacks.py``);
* legacy (``providers/hmac_callbacks.py``), kept for senders written against it:
  ``X-Aivedio-Signature: sha256=<hex>``, the HMAC-SHA256 of ``"{X-Aivedio-Timestamp}.{body}"``
  under the secret's UTF-8 bytes. The body is then decoded with the edge's
bounds (``untrusted.py``: depth, NUL, lengths, integer and time ranges; 400 naming the
field). Then one transaction records the event id (a
second delivery of the same id is refused with 409 ``replayed_event``: the first one was
recorded, since the receipt commits only together with what it recorded), and for a
SUCCEEDED task records each output and enqueues its fetch (``intake.record_task_outputs``,
the function vendor callbacks and the poller use). Nothing is downloaded here: the answer
takes milliseconds.

The tenant is the known task's; a task we never saw belongs to ``[providers.NAME] tenant``
(one provider account per tenant), and without one the callback is refused (422).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec
from aiohttp import web

from aivedio import untrusted
from aivedio.api import schema, vendor_callbacks
from aivedio.api.bodies import read_body
from aivedio.api.context import ApiContext, context
from aivedio.api.problems import ApiError
from aivedio.errors import ConfigError, MalformedInputError, PolicyBlockedError
from aivedio.logs import get_logger
from aivedio.pipeline.intake import Received, receive, record_task_outputs
from aivedio.providers import GENERIC_CALLBACK_SCHEME, callback_scheme, standard_webhooks
from aivedio.providers.hmac_callbacks import CallbackRejected, verify_signature
from aivedio.providers.seam import MAX_OUTPUT_BYTES, ProviderOutput, ProviderTask
from aivedio.states import Entity, allowed
from aivedio.store.callback_receipts import lock_task_by_provider_id
from aivedio.store.database import Connection, acquired, transaction
from aivedio.store.records import transition

log = get_logger("aivedio.api.callbacks")
routes = web.RouteTableDef()

TIMESTAMP_HEADER = "X-Aivedio-Timestamp"
SIGNATURE_HEADER = "X-Aivedio-Signature"
STANDARD_SIGNATURE_HEADER = "webhook-signature"

Text = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class CallbackOutput(msgspec.Struct, frozen=True, kw_only=True):
    index: Annotated[int, msgspec.Meta(ge=0, le=255)] = 0
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]
    # With its UTC offset (the schema then says date-time), within [now - 400 days,
    # now + 400 days] (``untrusted.instant``).
    expires_at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    sha256: Annotated[str, msgspec.Meta(pattern=untrusted.whole("^[0-9a-fA-F]{64}$"))] | None = None
    size: Annotated[int, msgspec.Meta(ge=0, le=MAX_OUTPUT_BYTES)] | None = None
    content_type: Annotated[str, msgspec.Meta(max_length=200)] | None = None


class CallbackBody(msgspec.Struct, frozen=True, kw_only=True):
    """What a provider (or its adapter) posts: the task's state and, on success, its
    outputs with their temporary download URLs."""

    event_id: Text
    task_id: Text
    status: Annotated[str, msgspec.Meta(pattern=untrusted.whole("^(?i:succeeded|running|failed)$"))]
    outputs: Annotated[list[CallbackOutput], msgspec.Meta(max_length=16)] = []


class RecordedOutput(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    provider_output_id: uuid.UUID
    fetch_job_id: int
    fetch_status: str
    created: bool


class CallbackAccepted(msgspec.Struct, frozen=True, kw_only=True):
    event_id: str
    task_id: str
    status: str
    generation_task_id: uuid.UUID | None
    outputs: list[RecordedOutput]


def _reject(
    ctx: ApiContext, provider: str, status: int, reason: str, detail: str, field: str | None = None
) -> ApiError:
    ctx.metrics.callbacks.labels(provider, reason).inc()
    log.warning("callback_rejected", provider=provider, reason=reason, detail=detail, field=field)
    return ApiError(status, detail, reason, field=field)


async def _read_body(request: web.Request, ctx: ApiContext, provider: str) -> bytes:
    try:
        return await read_body(
            request,
            limit_bytes=ctx.config.api.max_callback_bytes,
            timeout_seconds=ctx.config.api.body_read_timeout_seconds,
            what="callback body",
        )
    except ApiError as exc:
        raise _reject(ctx, provider, exc.status, exc.code, exc.detail) from None


def malformed(ctx: ApiContext, provider: str, exc: MalformedInputError) -> ApiError:
    """A verified body that the edge refused: 400 ``malformed``, naming the field."""
    return _reject(ctx, provider, 400, "malformed", f"callback body: {exc.detail}", exc.field)


@routes.post("/v1/providers/{provider}/callbacks")
async def callback(request: web.Request) -> web.Response:
    ctx = context(request)
    provider = request.match_info["provider"]
    provider_config = ctx.config.providers.get(provider)
    scheme = callback_scheme(provider_config) if provider_config is not None else "none"
    if provider_config is None or not (
        scheme == GENERIC_CALLBACK_SCHEME or vendor_callbacks.configured(provider_config, scheme)
    ):
        raise ApiError(404, f"no provider {provider!r} accepts callbacks here")
    body = await _read_body(request, ctx, provider)
    if scheme != GENERIC_CALLBACK_SCHEME:

        def reject(status: int, reason: str, detail: str, field: str | None = None) -> ApiError:
            return _reject(ctx, provider, status, reason, detail, field)

        return await vendor_callbacks.handle(
            ctx, request, provider, provider_config, scheme, body, reject
        )
    _verify(request, ctx, provider, provider_config.callback_secret, body)
    try:
        event = untrusted.decode(body, CallbackBody)
    except MalformedInputError as exc:
        raise malformed(ctx, provider, exc) from None
    status = event.status.upper()
    if status == "SUCCEEDED" and not event.outputs:
        raise _reject(ctx, provider, 422, "malformed", "a SUCCEEDED callback lists its outputs")
    async with acquired(ctx.pool) as conn, transaction(conn):
        # The receipt and the task's tenant: one round trip.
        received = await receive(conn, ctx.config, provider, event.task_id, event.event_id)
        if not received.fresh:
            raise _reject(
                ctx,
                provider,
                409,
                "replayed_event",
                f"event {event.event_id!r} was already received; nothing recorded",
            )
        accepted = await _record(ctx, conn, provider, event, status, received)
    ctx.metrics.callbacks.labels(provider, "accepted").inc()
    log.info(
        "callback_accepted",
        provider=provider,
        task_id=event.task_id,
        event_id=event.event_id,
        status=status,
        outputs=len(accepted.outputs),
    )
    return schema.encode(accepted, status=202)


def _verify(request: web.Request, ctx: ApiContext, provider: str, secret: str, body: bytes) -> None:
    """One of the two schemes (the module docstring), or a 401."""
    skew = ctx.config.api.callback_skew_seconds
    if STANDARD_SIGNATURE_HEADER in request.headers:
        try:
            standard_webhooks.verify(
                standard_webhooks.callback_key(secret),
                request.headers,
                body,
                tolerance_seconds=skew,
            )
        except CallbackRejected as exc:
            raise _reject(ctx, provider, 401, "bad_signature", exc.detail) from None
        except ConfigError:  # a whsec_ secret that is not base64: nothing can match
            raise _reject(ctx, provider, 401, "bad_signature", "signature does not match") from None
        return
    timestamp = request.headers.get(TIMESTAMP_HEADER)
    signature = request.headers.get(SIGNATURE_HEADER)
    if not timestamp or not signature:
        raise _reject(
            ctx,
            provider,
            401,
            "unsigned",
            f"{TIMESTAMP_HEADER} and {SIGNATURE_HEADER} (or the Standard Webhooks headers)"
            " are required",
        )
    try:
        verify_signature(secret.encode(), timestamp, body, signature, skew_seconds=skew)
    except CallbackRejected as exc:
        raise _reject(ctx, provider, 401, "bad_signature", exc.detail) from None


async def _record(
    ctx: ApiContext,
    conn: Connection,
    provider: str,
    event: CallbackBody,
    status: str,
    received: Received,
) -> CallbackAccepted:
    tenant_id = received.tenant_id
    if status != "SUCCEEDED":
        task_id = await _note_progress(conn, provider, event.task_id, status)
        return CallbackAccepted(
            event_id=event.event_id,
            task_id=event.task_id,
            status=status,
            generation_task_id=task_id,
            outputs=[],
        )
    if tenant_id is None:
        raise _reject(
            ctx,
            provider,
            422,
            "unknown_task",
            f"task {event.task_id!r} is unknown and [providers.{provider}] names no tenant",
        )
    task = ProviderTask(
        provider_task_id=event.task_id,
        status=status,
        outputs=[
            ProviderOutput(
                index=o.index,
                url=o.url,
                expires_at=o.expires_at,
                sha256=o.sha256,
                size=o.size,
                content_type=o.content_type,
            )
            for o in event.outputs
        ],
    )
    try:
        results = await record_task_outputs(
            conn,
            queue=ctx.queue,
            cipher=ctx.cipher,
            config=ctx.config,
            provider=provider,
            task=task,
            tenant_id=tenant_id,
            task_known=received.known,
        )
    except MalformedInputError as exc:
        raise malformed(ctx, provider, exc) from None
    except PolicyBlockedError as exc:
        raise _reject(ctx, provider, 422, "invalid_output", exc.detail) from None
    recorded = [
        RecordedOutput(
            index=output.index,
            provider_output_id=result.provider_output_id,
            fetch_job_id=result.fetch_job_id,
            fetch_status=result.fetch_status,
            created=result.output_created,
        )
        for output, result in zip(event.outputs, results, strict=True)
    ]
    task_uuid = results[-1].generation_task_id if results else None
    return CallbackAccepted(
        event_id=event.event_id,
        task_id=event.task_id,
        status=status,
        generation_task_id=task_uuid,
        outputs=recorded,
    )


async def _note_progress(
    conn: Connection, provider: str, task_id: str, status: str
) -> uuid.UUID | None:
    """RUNNING or FAILED for a task we know: move it when the state machine allows."""
    new = "PROVIDER_RUNNING" if status == "RUNNING" else "PROVIDER_FAILED"
    row = await lock_task_by_provider_id(conn, provider, task_id)
    if row is None:
        return None
    if allowed(Entity.GENERATION_TASK, row["provider_status"], new):
        await transition(
            conn,
            Entity.GENERATION_TASK,
            (row["id"],),
            expected=row["provider_status"],
            new=new,
            version=row["version"],
        )
    return uuid.UUID(str(row["id"]))


def _paths() -> dict[str, Any]:
    headers = [
        {
            "name": TIMESTAMP_HEADER,
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": "Unix seconds when the provider signed",
        },
        {
            "name": SIGNATURE_HEADER,
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": "sha256=<hex HMAC-SHA256 of '{timestamp}.{body}' with the secret>",
        },
    ]
    return {
        "/v1/providers/{provider}/callbacks": {
            "post": {
                "summary": "A provider reports a task's outcome",
                "description": (
                    "Generic providers sign with the X-Aivedio headers (required for them). "
                    "Vendor adapters use their own scheme: Standard Webhooks (Replicate, the "
                    "Gemini API's static and per-request webhooks), OpenRouter's "
                    "X-OpenRouter-Signature (t=<ts>,v1=<hex>; the body's <job_id>-<status> is "
                    "accepted once), fal's ED25519 headers, MiniMax's challenge echo, or none "
                    "(Luma, Kling, MiniMax, Seedance: a hint, confirmed by reading the task); "
                    "those answer VendorCallbackAccepted. A provider whose vendor shut its API "
                    "down (OpenAI video, 2026-09-24) answers 410 provider_shut_down. See "
                    "docs/providers.md."
                ),
                "operationId": "postProviderCallback",
                "tags": ["providers"],
                "security": [],
                "parameters": [
                    schema.path_param("provider", "configured provider name", uuid=False),
                    *headers,
                ],
                "requestBody": {"required": True, "content": schema.json_content(CallbackBody)},
                "responses": schema.responses(
                    {
                        "200": schema.ok_json(
                            {"type": "object", "properties": {"challenge": {"type": "string"}}},
                            "MiniMax's challenge, echoed",
                        ),
                        "410": {
                            "description": "the provider's vendor shut its API down "
                            "(provider_shut_down, naming the date): nothing is registered",
                            "content": schema.json_content(schema.Error),
                        },
                        "202": schema.ok_json(
                            {
                                "oneOf": [
                                    schema.ref(CallbackAccepted),
                                    schema.ref(vendor_callbacks.VendorCallbackAccepted),
                                ]
                            },
                            "recorded and fetches enqueued, or the task is read first",
                        ),
                    },
                    400,
                    401,
                    404,
                    408,
                    409,
                    413,
                    422,
                    503,
                ),
            }
        }
    }


PATHS = _paths()
SCHEMAS: tuple[type, ...] = (
    CallbackBody,
    CallbackAccepted,
    vendor_callbacks.VendorCallbackAccepted,
)
