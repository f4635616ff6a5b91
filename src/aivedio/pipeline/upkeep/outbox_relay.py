"""The outbox relay: every event to every webhook that wants it, at least once, in order.

Why a relay and not a POST in the publishing transaction: a request sent before commit
announces a change that may still roll back, and one sent after commit is lost if the
process dies in between. The event row commits with the change (``store.outbox.emit``); the
relay delivers it afterwards, for as long as it takes.

One pass (``deliver_once``): turn new events into delivery rows for each configured webhook,
claim up to ``batch_size`` due rows under a lease (a short statement, ``SKIP LOCKED``, so
relays in several workers share the work and never send one delivery twice at once), POST
them concurrently outside any transaction, and record each result if the lease is still
ours. The claim and store rules (lazy creation, leases, per-aggregate order) are in
``store/outbox.py``; this module is the HTTP side and the schedule.

The request. The body is JSON ``{"id", "type", "created_at", "tenant_id", "aggregate_id",
"passthrough", "data"}`` (``passthrough``: the client's string on the video or task, as
it was when the event was emitted), byte-identical on every attempt. It is signed in the
Standard Webhooks format, so a receiver verifies it with that project's libraries:
``webhook-id`` is the event id (stable across retries: the receiver's idempotency key, since
at least once means a receiver may see an event twice after a lost acknowledgement or a
lapsed lease), ``webhook-timestamp`` the unix seconds of this attempt, and
``webhook-signature`` one ``v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`` per
configured secret, space-separated: during a rotation both the old and the new secret sign,
and a receiver holding either accepts. A webhook still configured with the deprecated single
``secret`` also gets the legacy headers ``X-Aivedio-Event-Id``, ``X-Aivedio-Timestamp`` and
``X-Aivedio-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>." + body)>``.
``X-Aivedio-Event-Type`` and ``X-Aivedio-Delivery-Attempt`` are informational, unsigned.

The schedule. 2xx is delivered. Anything else is retried with full-jitter exponential backoff
(uniform in ``[0, min(backoff_max_seconds, base · 2^(n-1))]``) for ``retry_for_seconds`` after
the first attempt (24 h by default, as Mux does: a receiver down for an afternoon gets its
events without anyone's help); the delay that would overshoot the window is cut so that the last
attempt lands at its end (however long the attempt before took). Then the delivery is dead
(kept, with its last status and error, for an operator's replay: ``aivedio webhooks deliveries
retry``). An optional ``max_attempts`` caps the count as well. The window is measured by the
database's clock from the delivery's ``first_attempt_at``, so time spent waiting behind an
earlier event of the same asset is not counted. Timeouts, connection errors, 408, 429 and 5xx
are the receiver being unwell; ``Retry-After`` on 429 and 503 replaces the computed delay. Other
4xx and 3xx (redirects are not followed: a signed body goes where the operator said, nowhere
else) are retried too, because in practice they are a receiver mid-deploy or a rotated secret
that an operator fixes within the budget; they are logged at error level so someone does.

Tenants' own receivers (``POST /v1/webhooks``; read again whenever one may have changed,
``webhook_targets.ReceiverCache``) are delivered by the same rules, each only its tenant's
events, its URL under the fetch's address policy; a refused URL is a failed attempt.

Nothing stops the relay. The pass loop and its LISTEN run supervised (``supervision.py``:
any failure is logged, backed off and reported in the worker's ``/readyz`` until the next
success), and each delivery is handled alone (``RowGuard``): one whose row cannot be decoded,
or whose sending raises, is dead at once with the error (``scan_row_failed``), rather than
claimed again at every lease's end with its batch stuck behind it.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Literal

import aiohttp
import anyio
import msgspec
from anyio.abc import TaskStatus
from yarl import URL

from aivedio.config.load import DatabaseConfig
from aivedio.config.outbox import OutboxConfig, WebhookConfig
from aivedio.errors import DatabaseError, PolicyBlockedError, Retry
from aivedio.logs import get_logger, redact_text
from aivedio.metrics import SupervisionMetrics
from aivedio.net.fetch import client_url
from aivedio.net.policy import check_url
from aivedio.pipeline.upkeep.webhook_targets import (
    RECEIVERS_CHANNEL,
    ReceiverCache,
    Target,
    TenantDelivery,
    open_guarded_session,
    read_targets,
)
from aivedio.providers import standard_webhooks
from aivedio.scheduling import decide_retry
from aivedio.store import listening
from aivedio.store.database import Pool
from aivedio.store.outbox import NOTIFY_CHANNEL, Claimed, OutboxStore, Poisoned
from aivedio.store.webhook_receivers import WebhookReceiverStore
from aivedio.supervision import Conditions, Loop, RowGuard, error_class, supervise

log = get_logger("aivedio.outbox")

# A lease outlives the request's own timeout by this much (recording the result included).
LEASE_SLACK_SECONDS = 30.0
# Events walked per endpoint per pass when turning them into deliveries.
MATERIALISE_LIMIT = 1000
# Bound on recording a result or handing deliveries back while the relay stops.
RELEASE_TIMEOUT_SECONDS = 5.0
SIGNATURE_VERSION = "v1"
# decide_retry's attempt budget when only the time window bounds the retries.
NO_ATTEMPT_CAP = 2**62


# -- pure: the request and the schedule ------------------------------------------------------


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """Legacy: ``v1=`` and the hex HMAC-SHA256 of ``"<timestamp>." + body`` under the
    secret's UTF-8 (for webhooks still configured with the deprecated single ``secret``)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"{SIGNATURE_VERSION}={mac.hexdigest()}"


def signatures(keys: list[bytes], webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one ``v1,<base64>`` per key, space-separated."""
    return " ".join(standard_webhooks.sign(k, webhook_id, str(timestamp), body) for k in keys)


def encode_body(c: Claimed) -> bytes:
    return msgspec.json.encode(
        {
            "id": str(c.event_id),
            "type": c.event_type,
            "created_at": c.created_at,
            "tenant_id": c.tenant_id,
            "aggregate_id": str(c.aggregate_id) if c.aggregate_id else None,
            "passthrough": c.passthrough,
            "data": c.payload,
        }
    )


def request_headers(c: Claimed, hook: WebhookConfig, timestamp: int, body: bytes) -> dict[str, str]:
    webhook_id = str(c.event_id)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "aivedio-outbox/1",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures(hook.signing_keys(), webhook_id, timestamp, body),
        "X-Aivedio-Event-Type": c.event_type,
        "X-Aivedio-Delivery-Attempt": str(c.attempts),
    }
    if hook.legacy:
        headers["X-Aivedio-Event-Id"] = webhook_id
        headers["X-Aivedio-Timestamp"] = str(timestamp)
        headers["X-Aivedio-Signature"] = sign(hook.secret, timestamp, body)
    return headers


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` of delta-seconds or an HTTP date; None if unusable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one POST got: a status, or None when no answer came (timeout, refused…)."""

    status: int | None
    error: str = ""
    retry_after_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def receiver_rejected(self) -> bool:
        """A 3xx or 4xx that is not about load: the receiver's URL, auth or code is wrong."""
        return (
            self.status is not None and 300 <= self.status < 500 and self.status not in (408, 429)
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: Literal["delivered", "retry", "dead"]
    delay_seconds: float = 0.0
    reason: str = ""


def judge(
    attempt: Attempt,
    *,
    attempts: int,
    retrying_seconds: float,
    retry_for_seconds: float,
    base_seconds: float,
    max_seconds: float,
    max_attempts: int = 0,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """Delivered, retry after a delay, or dead. ``attempts`` counts this one (1 for the
    first); ``retrying_seconds`` is the time since the first attempt started (0 for it)."""
    if attempt.ok:
        return Outcome("delivered")
    if retrying_seconds >= retry_for_seconds:
        return Outcome("dead", reason=f"retried for {retry_for_seconds:g}s")
    decision = decide_retry(
        retry_class=Retry.BACKOFF,
        attempts=attempts,
        max_attempts=max_attempts or NO_ATTEMPT_CAP,
        base_seconds=base_seconds,
        max_seconds=max_seconds,
        retry_after_seconds=attempt.retry_after_seconds,
        rand=rand,
    )
    if not decision.retry:
        return Outcome("dead", reason=decision.reason)
    # The last attempt lands at the window's end rather than never.
    delay = min(decision.delay_seconds, retry_for_seconds - retrying_seconds)
    return Outcome("retry", delay, decision.reason)


# -- the relay -------------------------------------------------------------------------------


class OutboxRelay:
    """Delivers outbox events to the configured webhooks, and to tenants' receivers when
    ``tenants`` is given (with ``guarded_session`` to reach them); ``run`` until cancelled."""

    def __init__(
        self,
        config: OutboxConfig,
        pool: Pool,
        session: aiohttp.ClientSession,
        *,
        database: DatabaseConfig | None = None,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
        conditions: Conditions | None = None,
        metrics: SupervisionMetrics | None = None,
        tenants: TenantDelivery | None = None,
        guarded_session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.config = config
        self.store = OutboxStore(pool)
        self._tenants = tenants
        self._receivers = (
            ReceiverCache(WebhookReceiverStore(pool, tenants.cipher)) if tenants else None
        )
        self._guarded_session = guarded_session
        # Both loops supervised (down in the worker's /readyz while they fail); a delivery
        # that cannot be decoded or sent is isolated (dead), never a stuck relay.
        self.loop = Loop(
            "outbox_relay",
            conditions=conditions,
            event="outbox_relay_failed",
            max_seconds=30.0,
            rand=rand,
        )
        self.listen_loop = Loop(
            "outbox_listen", conditions=conditions, event="outbox_listen_lost", rand=rand
        )
        self.rows = RowGuard(metrics)
        self.session = session
        self._database = database  # for LISTEN; None: poll only
        self._clock = clock
        self._rand = rand
        self._hooks = dict(config.webhooks)
        self._targets = {name: Target(hook) for name, hook in self._hooks.items()}
        timeouts = [h.timeout_seconds for h in self._hooks.values()]
        if tenants is not None:
            timeouts.append(tenants.timeout_seconds)
        self._lease_seconds = LEASE_SLACK_SECONDS + max(timeouts, default=0.0)
        self._registered = False
        self._backlog = False
        self._next_due: float | None = None
        self._wake = anyio.Event()

    async def register(self) -> None:
        """Give each configured webhook its cursor (first sight only): from now on, events
        are delivered to it. ``run`` does this before reporting started."""
        if self._hooks:
            await self.store.register(list(self._hooks))
        self._registered = True

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self.register()
        async with anyio.create_task_group() as tg:
            if not self._hooks and self._tenants is None:
                task_status.started()
                await anyio.sleep_forever()
            if self._database is not None:
                tg.start_soon(self._listen, self._database)
            task_status.started()
            log.info(
                "outbox_relay_started",
                endpoints=sorted(self._hooks),
                tenant_receivers=self._tenants is not None,
            )
            for name, hook in sorted(self._hooks.items()):
                if hook.legacy:
                    log.warning(
                        "outbox_webhook_secret_deprecated",
                        endpoint=name,
                        hint='move the secret into secrets as "whsec_" + its base64',
                    )
            await supervise(self.loop, self._relay)

    async def _relay(self) -> None:
        while True:
            claimed = await self.deliver_once()
            self.loop.ok()
            if claimed < self.config.batch_size and not self._backlog:
                await self._idle()

    async def deliver_once(self) -> int:
        """One pass: create deliveries, claim, send, record. Returns how many were claimed."""
        if not self._hooks and self._receivers is None:
            return 0
        if not self._registered:
            await self.register()
        self._backlog = False
        self._targets = await read_targets(self._hooks, self._receivers, self._tenants)
        if not self._targets:
            return 0
        for name, target in self._targets.items():
            walked, _ = await self.store.materialise(
                name, target.hook.event_types, MATERIALISE_LIMIT, target.tenant_id
            )
            self._backlog |= walked >= MATERIALISE_LIMIT
        token = uuid.uuid4()
        claimed = await self.store.claim(
            list(self._targets), self.config.batch_size, token, self._lease_seconds, self.rows
        )
        unfinished = {(c.endpoint, c.outbox_event_id): c for c in claimed if isinstance(c, Claimed)}
        try:
            async with anyio.create_task_group() as tg:
                for c in claimed:
                    if isinstance(c, Poisoned):
                        tg.start_soon(self._bury, c.endpoint, c.outbox_event_id, token, c.error)
                    else:
                        tg.start_soon(self._isolated, c, token, unfinished)
        finally:
            if unfinished:
                await self._release(list(unfinished.values()), token)
        return len(claimed)

    async def _isolated(
        self, c: Claimed, token: uuid.UUID, unfinished: dict[tuple[str, int], Claimed]
    ) -> None:
        """One delivery, alone: one that raises (a bug, a payload nothing can send) is
        logged, counted and dead, so the relay is not stuck on it and the events after it
        of its aggregate flow (a dead event no longer holds them back)."""
        with self.rows.row("outbox_relay", c.outbox_event_id) as row:
            await self._deliver(c, token, unfinished)
        if row.error is not None:
            unfinished.pop((c.endpoint, c.outbox_event_id), None)
            error = f"{error_class(row.error)}: {redact_text(str(row.error))}"[:500]
            await self._bury(c.endpoint, c.outbox_event_id, token, error)

    async def _bury(
        self, endpoint: str, outbox_event_id: int, token: uuid.UUID, error: str
    ) -> None:
        held = False
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT_SECONDS):
                held = await self.store.bury(endpoint, outbox_event_id, token, error)
        except DatabaseError as exc:  # the lease runs out; the next claim isolates it again
            log.warning(
                "outbox_result_not_recorded",
                outbox_event_id=outbox_event_id,
                endpoint=endpoint,
                error=str(exc),
            )
            return
        if held:
            log.error(
                "outbox_delivery_dead",
                outbox_event_id=outbox_event_id,
                endpoint=endpoint,
                error=error,
                reason="isolated",
            )

    async def _deliver(
        self, c: Claimed, token: uuid.UUID, unfinished: dict[tuple[str, int], Claimed]
    ) -> None:
        target = self._targets.get(c.endpoint)
        if target is None:
            # A receiver deleted since this pass read them: its rows went with it.
            unfinished.pop((c.endpoint, c.outbox_event_id), None)
            return
        hook = target.hook
        if hook.max_attempts and c.attempts > hook.max_attempts:
            # The sender of the last attempt lost its lease (it died or stalled): the budget
            # is spent; sending again would exceed it. (A time window's last attempt may be
            # sent once more instead: at least once, never a lost event.)
            attempt = Attempt(None, "lease lapsed during the last attempt")
            outcome = Outcome("dead", reason=f"retry budget spent ({hook.max_attempts})")
        else:
            attempt = await self._post(target, c)
            outcome = judge(
                attempt,
                attempts=c.attempts,
                retrying_seconds=c.retrying_seconds,
                retry_for_seconds=hook.retry_for_seconds,
                max_attempts=hook.max_attempts,
                base_seconds=self.config.backoff_base_seconds,
                max_seconds=self.config.backoff_max_seconds,
                rand=self._rand,
            )
        try:
            # Shielded: a stop arriving now must not turn a delivered request into a resend.
            with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT_SECONDS):
                await self._record(c, token, attempt, outcome, hook.retry_for_seconds)
        except DatabaseError as exc:
            # The lease runs out and the delivery is sent again: at least once, as promised.
            log.warning(
                "outbox_result_not_recorded",
                event_id=str(c.event_id),
                endpoint=c.endpoint,
                error=str(exc),
            )
        unfinished.pop((c.endpoint, c.outbox_event_id), None)

    async def _post(self, target: Target, c: Claimed) -> Attempt:
        hook = target.hook
        body = encode_body(c)
        timestamp = int(self._clock())
        headers = request_headers(c, hook, timestamp, body)
        session = self.session
        wire: str | URL = hook.url
        try:
            if target.guarded:
                assert self._tenants is not None and self._guarded_session is not None
                wire = client_url(hook.url, check_url(hook.url, self._tenants.policy))
                session = self._guarded_session
            with anyio.fail_after(hook.timeout_seconds):
                async with session.post(
                    wire,
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                ) as response:
                    status = response.status
                    retry_after = None
                    if status in (429, 503):
                        retry_after = parse_retry_after(response.headers.get("Retry-After"))
                    return Attempt(
                        status, "" if 200 <= status < 300 else f"HTTP {status}", retry_after
                    )
        except PolicyBlockedError as exc:
            return Attempt(None, f"blocked: {redact_text(exc.detail)}"[:500])
        except TimeoutError:
            return Attempt(None, f"no answer within {hook.timeout_seconds:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, PolicyBlockedError):
                return Attempt(None, f"blocked: {redact_text(cause.detail)}"[:500])
            return Attempt(None, redact_text(f"{type(exc).__name__}: {exc}"))

    async def _record(
        self, c: Claimed, token: uuid.UUID, attempt: Attempt, outcome: Outcome, window: float
    ) -> None:
        fields = {
            "event_id": str(c.event_id),
            "event_type": c.event_type,
            "endpoint": c.endpoint,
            "tenant_id": c.tenant_id,
            "aggregate_id": str(c.aggregate_id) if c.aggregate_id else None,
            "attempt": c.attempts,
            "status": attempt.status,
        }
        if outcome.kind == "delivered":
            assert attempt.status is not None
            held = await self.store.delivered(c, token, attempt.status)
            if held:
                log.info("outbox_delivered", **fields)
        elif outcome.kind == "retry":
            due_in = await self.store.retry(
                c,
                token,
                delay_seconds=outcome.delay_seconds,
                window_seconds=window,
                status=attempt.status,
                error=attempt.error,
            )
            due = anyio.current_time() + (outcome.delay_seconds if due_in is None else due_in)
            self._next_due = due if self._next_due is None else min(self._next_due, due)
            if held := due_in is not None:
                report = log.error if attempt.receiver_rejected else log.warning
                report(
                    "outbox_delivery_retry",
                    **fields,
                    error=attempt.error,
                    delay_seconds=round(outcome.delay_seconds, 3),
                    receiver_rejected=attempt.receiver_rejected,
                )
        else:
            held = await self.store.dead(c, token, status=attempt.status, error=attempt.error)
            if held:
                log.error(
                    "outbox_delivery_dead", **fields, error=attempt.error, reason=outcome.reason
                )
        if not held:
            log.warning("outbox_delivery_lease_lost", **fields, outcome=outcome.kind)

    async def _release(self, claimed: list[Claimed], token: uuid.UUID) -> None:
        """Stopping mid-pass: hand the unfinished back, shielded and bounded. A request that
        did reach its receiver will be sent again (same event id): at least once."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT_SECONDS):
            try:
                await self.store.release(claimed, token)
            except DatabaseError as exc:
                log.warning("outbox_release_failed", deliveries=len(claimed), error=str(exc))

    async def _idle(self) -> None:
        delay = self.config.poll_interval_seconds
        if self._next_due is not None:
            # Wake for the earliest retry this relay scheduled (plus a little: the database's
            # clock decides when it is due).
            delay = min(delay, max(0.0, self._next_due - anyio.current_time()) + 0.01)
            self._next_due = None
        with anyio.move_on_after(delay):
            await self._wake.wait()
        self._wake = anyio.Event()

    async def _listen(self, database: DatabaseConfig) -> None:
        """LISTEN for new events to wake at once; the poll interval covers any gap."""

        cache = self._receivers  # told of changes to the receivers, and of gaps
        channels = {NOTIFY_CHANNEL: lambda *_: self._wake.set()}
        if cache is not None:
            channels[RECEIVERS_CHANNEL] = cache.heard

        def on_listening() -> None:
            self._wake.set()  # events emitted before the LISTEN took effect woke nobody
            if cache is not None:
                cache.listen(True)

        stopped = cache.stopped if cache is not None else None
        await listening.run(
            self.listen_loop, database, channels, on_listening=on_listening, on_stopped=stopped
        )


@asynccontextmanager
async def open_outbox_relay(
    config: OutboxConfig,
    pool: Pool,
    *,
    database: DatabaseConfig | None = None,
    conditions: Conditions | None = None,
    metrics: SupervisionMetrics | None = None,
    tenants: TenantDelivery | None = None,
) -> AsyncIterator[OutboxRelay]:
    """Run a relay in the background for the body's duration; stop it on exit (deliveries in
    flight are handed back). With ``database``, a LISTEN connection wakes it on new events;
    ``conditions`` (the worker's) report its loops while they fail; with ``tenants``, it
    delivers tenants' own receivers too."""
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(
            aiohttp.ClientSession(
                trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None),  # the relay's fail_after rules
                connector=aiohttp.TCPConnector(limit=max(config.batch_size, 1)),
            )
        )
        guarded = None
        if tenants is not None:
            guarded = await stack.enter_async_context(
                open_guarded_session(tenants, config.batch_size)
            )
        relay = OutboxRelay(
            config,
            pool,
            session,
            database=database,
            conditions=conditions,
            metrics=metrics,
            tenants=tenants,
            guarded_session=guarded,
        )
        async with anyio.create_task_group() as tg:
            await tg.start(relay.run)
            try:
                yield relay
            finally:
                tg.cancel_scope.cancel()
