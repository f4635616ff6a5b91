"""``/v1/webhooks``: a tenant's own webhook receivers, and their deliveries.

``POST`` creates a receiver and answers its secret (``whsec_…``) once: it is sealed at rest
and never shown again; ``POST …/rotate-secret`` makes a new one (answered once too) while the
replaced one keeps signing for ``PREVIOUS_SECRET_VALID_SECONDS``, so the receiver switches
without refusing a delivery. The relay delivers the tenant's events to each, in the
Standard Webhooks format, for a day of retries, like the configured webhooks.

The URL is a tenant's, so it is held to the fetch's address policy
(``pipeline/upkeep/webhook_targets.py``): here as written (a metadata address or loopback
literal, a refused scheme or port: 422 naming the rule), and by the relay again at every
connection (a name that resolves there is refused then). Every query carries the caller's
tenant: another tenant's id answers like a missing one (404).

``GET /v1/webhooks/deliveries`` lists the deliveries to the tenant's receivers, newest event
first, a page at a time; ``POST /v1/webhooks/deliveries/{event_id}/retry`` makes that
event's dead (or pending) deliveries due now, the dead with a fresh budget.

No ``Idempotency-Key`` on the creation: the answer holds the secret, and a kept answer
would keep it in clear (create again and delete the spare instead).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

import msgspec
from aiohttp import web

from aivedio import untrusted
from aivedio.api import cursors, schema
from aivedio.api.auth import tenant_of
from aivedio.api.bodies import read_body
from aivedio.api.context import context
from aivedio.api.ids import path_uuid
from aivedio.api.problems import ApiError
from aivedio.config.outbox import EVENT_TYPES
from aivedio.errors import MalformedInputError, PolicyBlockedError
from aivedio.logs import get_logger
from aivedio.net.policy import check_url
from aivedio.pipeline.upkeep.webhook_targets import receiver_policy
from aivedio.store import webhook_deliveries
from aivedio.store.webhook_receivers import Receiver, WebhookReceiverStore

log = get_logger("aivedio.api")
routes = web.RouteTableDef()

BODY_MAX_BYTES = 16 * 1024
PREVIOUS_SECRET_VALID_SECONDS = 86400
DEFAULT_LIMIT = 25
MAX_LIMIT = 100
MAX_URL_CHARS = 2048
# Hex and dashes only, so /v1/webhooks/deliveries is never read as a webhook's id (nor shares
# its Allow header); another id is a 404 either way.
WEBHOOK_ID = "{webhook_id:[0-9a-fA-F-]+}"

EventType = Literal[
    "asset.ready",
    "asset.rejected",
    "asset.invalid",
    "output.lost",
    "asset.deleted",
    "asset.integrity_failed",
]
assert set(get_args(EventType)) == EVENT_TYPES  # one list, stated twice for the schema
Url = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_URL_CHARS)]
Description = Annotated[str, msgspec.Meta(max_length=255)]


class CreateWebhook(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A receiver: where to POST, and which events (empty: every one)."""

    url: Url
    event_types: Annotated[list[EventType], msgspec.Meta(max_length=len(EVENT_TYPES))] = []
    description: Description | None = None


class Webhook(msgspec.Struct, frozen=True, kw_only=True):
    webhook_id: uuid.UUID
    url: str
    event_types: list[str]
    description: str | None
    created_at: datetime
    # Until then the secret a rotation replaced still signs (null: none does).
    previous_secret_expires_at: datetime | None


class CreatedWebhook(msgspec.Struct, frozen=True, kw_only=True):
    webhook_id: uuid.UUID
    url: str
    event_types: list[str]
    description: str | None
    created_at: datetime
    previous_secret_expires_at: datetime | None
    # Shown once: whsec_ and base64, for a Standard Webhooks verifier.
    secret: str


class WebhookList(msgspec.Struct, frozen=True, kw_only=True):
    data: list[Webhook]


class WebhookDeleted(msgspec.Struct, frozen=True, kw_only=True):
    webhook_id: uuid.UUID
    deleted: bool


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    event_id: uuid.UUID
    webhook_id: uuid.UUID
    event_type: str
    # pending (retrying, or not yet sent), delivered, dead (gave up; retry it)
    state: str
    attempts: int
    last_status: int | None
    last_error: str | None
    created_at: datetime
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    dead_at: datetime | None


class DeliveryPage(msgspec.Struct, frozen=True, kw_only=True):
    data: list[Delivery]
    next_cursor: str | None


class Replayed(msgspec.Struct, frozen=True, kw_only=True):
    event_id: uuid.UUID
    webhook_id: uuid.UUID


class ReplayedList(msgspec.Struct, frozen=True, kw_only=True):
    replayed: list[Replayed]


def _store(request: web.Request) -> WebhookReceiverStore:
    ctx = context(request)
    return WebhookReceiverStore(ctx.pool, ctx.cipher)


def _shown(r: Receiver) -> Webhook:
    return Webhook(
        webhook_id=r.id,
        url=r.url,
        event_types=r.event_types,
        description=r.description,
        created_at=r.created_at,
        previous_secret_expires_at=r.previous_secret_expires_at,
    )


def _with_secret(r: Receiver, secret: str) -> CreatedWebhook:
    return CreatedWebhook(**msgspec.structs.asdict(_shown(r)), secret=secret)


# -- deliveries ------------------------------------------------------------------------------


class _Cursor(msgspec.Struct, frozen=True, array_like=True):
    list: str
    outbox_event_id: int
    endpoint: str


def _encode_cursor(position: tuple[int, str]) -> str:
    return cursors.encode(_Cursor("webhook_deliveries", *position))


def _decode_cursor(text: str) -> tuple[int, str]:
    cursor = cursors.decode(text, _Cursor, "webhook_deliveries")
    return cursor.outbox_event_id, cursor.endpoint


def _single(request: web.Request, name: str) -> str | None:
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise ApiError(400, f"{name}: give it once", field=name)
    return values[0] if values else None


@routes.get("/v1/webhooks/deliveries")
async def list_deliveries(request: web.Request) -> web.Response:
    raw_limit = _single(request, "limit") or str(DEFAULT_LIMIT)
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise ApiError(400, f"limit: an integer from 1 to {MAX_LIMIT}", field="limit")
    state = _single(request, "state")
    if state is not None and state not in webhook_deliveries.STATES:
        raise ApiError(400, f"state: one of {', '.join(webhook_deliveries.STATES)}", field="state")
    webhook = _single(request, "webhook_id")
    try:
        webhook_id = uuid.UUID(webhook) if webhook is not None else None
    except ValueError:
        raise ApiError(400, "webhook_id: not a webhook id", field="webhook_id") from None
    cursor = _single(request, "cursor")
    limit = int(raw_limit)
    rows = await webhook_deliveries.tenant_deliveries(
        context(request).pool,
        tenant_of(request),
        webhook_id=webhook_id,
        state=state,
        after=_decode_cursor(cursor) if cursor is not None else None,
        limit=limit + 1,
    )
    next_cursor = _encode_cursor(rows[limit - 1].position) if len(rows) > limit else None
    items = [
        Delivery(**{k: v for k, v in msgspec.structs.asdict(d).items() if k != "position"})
        for d in rows[:limit]
    ]
    return schema.encode(DeliveryPage(data=items, next_cursor=next_cursor))


@routes.post("/v1/webhooks/deliveries/{event_id}/retry")
async def retry_delivery(request: web.Request) -> web.Response:
    event_id = path_uuid(request, "event_id", "delivery to retry")
    tenant_id = tenant_of(request)
    replayed = await webhook_deliveries.tenant_replay(context(request).pool, tenant_id, event_id)
    if not replayed:
        raise ApiError(404, "no dead or pending delivery of this event to retry")
    log.info("webhook_deliveries_replayed", tenant_id=tenant_id, event_id=str(event_id))
    return schema.encode(
        ReplayedList(replayed=[Replayed(event_id=e, webhook_id=w) for e, w in replayed])
    )


# -- receivers ----------------------------------------------------------------------------------


@routes.post("/v1/webhooks")
async def create_webhook(request: web.Request) -> web.Response:
    ctx = context(request)
    body = await read_body(
        request,
        limit_bytes=BODY_MAX_BYTES,
        timeout_seconds=ctx.config.api.body_read_timeout_seconds,
    )
    try:
        wanted = untrusted.decode(body, CreateWebhook)
    except MalformedInputError as exc:
        raise ApiError(400, f"request body: {exc.detail}", exc.reason, field=exc.field) from None
    try:
        check_url(wanted.url, receiver_policy(ctx.config.net))
    except PolicyBlockedError as exc:
        reason = exc.detail.partition(":")[0]
        raise ApiError(422, f"url: {exc.detail}", reason, field="$.url") from None
    tenant_id = tenant_of(request)
    try:
        receiver, secret = await _store(request).create(
            tenant_id, wanted.url, sorted(set(wanted.event_types)), wanted.description
        )
    except PolicyBlockedError as exc:
        raise ApiError(422, exc.detail, exc.detail.partition(":")[0]) from None
    log.info("webhook_receiver_created", tenant_id=tenant_id, webhook_id=str(receiver.id))
    return schema.encode(_with_secret(receiver, secret), status=201)


@routes.get("/v1/webhooks")
async def list_webhooks(request: web.Request) -> web.Response:
    receivers = await _store(request).list_for(tenant_of(request))
    return schema.encode(WebhookList(data=[_shown(r) for r in receivers]))


@routes.get(f"/v1/webhooks/{WEBHOOK_ID}")
async def get_webhook(request: web.Request) -> web.Response:
    webhook_id = path_uuid(request, "webhook_id", "webhook")
    receiver = await _store(request).get(tenant_of(request), webhook_id)
    if receiver is None:
        raise ApiError(404, "no such webhook")
    return schema.encode(_shown(receiver))


@routes.delete(f"/v1/webhooks/{WEBHOOK_ID}")
async def delete_webhook(request: web.Request) -> web.Response:
    webhook_id = path_uuid(request, "webhook_id", "webhook")
    tenant_id = tenant_of(request)
    if not await _store(request).delete(tenant_id, webhook_id):
        raise ApiError(404, "no such webhook")
    log.info("webhook_receiver_deleted", tenant_id=tenant_id, webhook_id=str(webhook_id))
    return schema.encode(WebhookDeleted(webhook_id=webhook_id, deleted=True))


@routes.post(f"/v1/webhooks/{WEBHOOK_ID}/rotate-secret")
async def rotate_secret(request: web.Request) -> web.Response:
    webhook_id = path_uuid(request, "webhook_id", "webhook")
    tenant_id = tenant_of(request)
    rotated = await _store(request).rotate(tenant_id, webhook_id, PREVIOUS_SECRET_VALID_SECONDS)
    if rotated is None:
        raise ApiError(404, "no such webhook")
    log.info("webhook_secret_rotated", tenant_id=tenant_id, webhook_id=str(webhook_id))
    return schema.encode(_with_secret(*rotated))


# -- the document --------------------------------------------------------------------------------


def _query(name: str, description: str, value: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": value,
    }


def _paths() -> dict[str, Any]:
    webhook = schema.path_param("webhook_id", "the webhook id")
    of_webhook = {
        "getWebhook": schema.link(
            "getWebhook", "the webhook", {"webhook_id": "$response.body#/webhook_id"}
        ),
        "rotateWebhookSecret": schema.link(
            "rotateWebhookSecret", "a new secret", {"webhook_id": "$response.body#/webhook_id"}
        ),
        "deleteWebhook": schema.link(
            "deleteWebhook", "delete it", {"webhook_id": "$response.body#/webhook_id"}
        ),
    }
    return {
        "/v1/webhooks": {
            "post": {
                "summary": "Create a webhook receiver; its secret is in this answer only",
                "description": "The URL is held to the fetch's address policy (no private, "
                "loopback or metadata address; the allowed schemes and ports): 422 naming the "
                "rule. A tenant has at most 20 receivers (422 too_many_webhooks).",
                "operationId": "createWebhook",
                "tags": ["webhooks"],
                "requestBody": {"required": True, "content": schema.json_content(CreateWebhook)},
                "responses": schema.responses(
                    {"201": {**schema.ok_json(CreatedWebhook, "created"), "links": of_webhook}},
                    400,
                    408,
                    413,
                    422,
                    503,
                ),
            },
            "get": {
                "summary": "The tenant's webhook receivers, newest first",
                "operationId": "listWebhooks",
                "tags": ["webhooks"],
                "responses": schema.responses({"200": schema.ok_json(WebhookList)}, 503),
            },
        },
        "/v1/webhooks/{webhook_id}": {
            "get": {
                "summary": "A webhook receiver (never its secret)",
                "operationId": "getWebhook",
                "tags": ["webhooks"],
                "parameters": [webhook],
                "responses": schema.responses({"200": schema.ok_json(Webhook)}, 404, 503),
            },
            "delete": {
                "summary": "Delete a webhook receiver and its deliveries",
                "operationId": "deleteWebhook",
                "tags": ["webhooks"],
                "parameters": [webhook],
                "responses": schema.responses({"200": schema.ok_json(WebhookDeleted)}, 404, 503),
            },
        },
        "/v1/webhooks/{webhook_id}/rotate-secret": {
            "post": {
                "summary": "A new secret (in this answer only); the old one signs for 24 h more",
                "operationId": "rotateWebhookSecret",
                "tags": ["webhooks"],
                "parameters": [webhook],
                "responses": schema.responses(
                    {"200": schema.ok_json(CreatedWebhook, "rotated")}, 404, 503
                ),
            },
        },
        "/v1/webhooks/deliveries": {
            "get": {
                "summary": "Deliveries to the tenant's webhook receivers, newest event first",
                "operationId": "listWebhookDeliveries",
                "tags": ["webhooks"],
                "parameters": [
                    _query(
                        "limit",
                        f"items per page, 1 to {MAX_LIMIT}",
                        {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_LIMIT,
                            "default": DEFAULT_LIMIT,
                        },
                    ),
                    _query(
                        "cursor",
                        "the next_cursor of the page before",
                        {"type": "string", "maxLength": 200},
                    ),
                    _query(
                        "state",
                        "only deliveries in this state",
                        {"type": "string", "enum": list(webhook_deliveries.STATES)},
                    ),
                    _query(
                        "webhook_id",
                        "only this receiver's",
                        {"type": "string", "format": "uuid"},
                    ),
                ],
                "responses": schema.responses({"200": schema.ok_json(DeliveryPage)}, 400, 503),
            },
        },
        "/v1/webhooks/deliveries/{event_id}/retry": {
            "post": {
                "summary": "Send an event's dead (or pending) deliveries again, now",
                "description": "A dead delivery gets a fresh budget (a day of retries). 404 "
                "when the event has no dead or pending delivery to the tenant's receivers.",
                "operationId": "retryWebhookDelivery",
                "tags": ["webhooks"],
                "parameters": [schema.path_param("event_id", "the event id (webhook-id)")],
                "responses": schema.responses({"200": schema.ok_json(ReplayedList)}, 404, 503),
            },
        },
    }


PATHS = _paths()
SCHEMAS: tuple[type, ...] = (
    CreateWebhook,
    Webhook,
    CreatedWebhook,
    WebhookList,
    WebhookDeleted,
    DeliveryPage,
    ReplayedList,
)
