"""The fetch stage: a provider output's temporary URL into quarantine storage, exactly once.

One job per ``(provider_output_id, pipeline_version)``. Each attempt:

1. reads the output row; a STORED or terminal output makes the job a no-op (duplicates);
2. refreshes the URL through the provider adapter when it has expired or was refused
   (never a new generation); an adapter that says "gone" ends in OUTPUT_LOST with an
   outbox event;
3. resumes from a verified object when the deterministic quarantine key already exists (the
   previous attempt uploaded it but died before its transaction): an object exists only if
   its upload completed, and an upload completes only after the size and checksum checks,
   so the object is read back once for its SHA-256 instead of downloading again;
4. otherwise aborts any multipart upload a dead attempt left on that key, streams the body
   through the guarded fetcher into a new upload, checks size against Content-Length and the
   provider's expected size, SHA-256 against the provider's checksum, then completes the
   upload and HEADs it. A body cut short is resumed by the fetcher into the same upload;
   one the origin starts over (a 200 to the resume) gets a new upload, the old one aborted;
5. in one transaction: output FETCHING → STORED, the QUARANTINED asset, the probe job.

Failures leave the output in the state its error class calls for, and raise that error, so
the queue retries, waits for Retry-After, or buries the job: a refused or expired URL waits
for a refresh (NEED_URL_REFRESH); a body over the size limit, one the network policy blocks
or a malformed answer is never fetched again (INVALID_RESPONSE), as is one whose checksum
keeps failing; any other failure waits (RETRY_WAIT) for the queue's retry or, its attempts
spent, an operator's replay; an output whose URL has expired with no retry left, or that the
provider says is gone, is lost (OUTPUT_LOST, with its ``output.lost`` event and the ledger's
compensation). Steps 3 and 4 are the transfer
(``pipeline.fetch_transfer``).

Metrics (given the worker's, as the media stage gets them through its hooks): every download
attempt counts the HTTP status that ended it by provider (``none`` when none did: no
connection, a policy refusal, a deadline, a body cut short), so a provider's 429 rate is its
own; a transfer that stored its bytes observes its seconds, request to completed upload.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg
import msgspec

from aivedio.config.load import Config
from aivedio.crypto import UrlCipher
from aivedio.errors import (
    AivedioError,
    ChecksumMismatchError,
    DatabaseError,
    DeferredError,
    InvalidResponseError,
    LeaseLostError,
    NotYetAvailableError,
    OutputLostError,
    PolicyBlockedError,
    ProviderServerError,
    Retry,
    StaleStateError,
    ThrottledError,
    TooLargeError,
    TransientError,
    UrlExpiredError,
)
from aivedio.logs import get_logger, url_for_log
from aivedio.metrics import WorkerMetrics
from aivedio.net.fetch import Fetcher, FetchResult
from aivedio.net.limits import CircuitBreaker, HostLimiter
from aivedio.pipeline import jobs
from aivedio.pipeline import output_records as records
from aivedio.pipeline.fetch_transfer import Resumed, Transfer, host_of
from aivedio.pipeline.jobs import JobContext, Registry, probe_spec
from aivedio.pipeline.output_records import OutputRow
from aivedio.providers.seam import ProviderAdapter
from aivedio.scheduling import decide_retry
from aivedio.states import Entity
from aivedio.store import provider_outputs
from aivedio.store.database import Connection, Pool, acquired
from aivedio.store.objects import keys
from aivedio.store.objects.base import ObjectInfo, ObjectStore
from aivedio.store.queue import Job, Queue, fenced, write_fenced
from aivedio.store.records import stale, transition, transition_part

log = get_logger("aivedio.fetch")

KIND = jobs.FETCH.name
LANE = jobs.FETCH.lane


@dataclass
class FetchServices:
    """What the stage needs; built once per worker."""

    config: Config
    pool: Pool
    queue: Queue
    store: ObjectStore
    cipher: UrlCipher
    fetchers: dict[str, Fetcher]  # by provider; "" is the default under [net]
    adapters: dict[str, ProviderAdapter]
    hosts: HostLimiter
    breakers: dict[str, CircuitBreaker] = field(default_factory=dict)

    def fetcher(self, provider: str) -> Fetcher:
        return self.fetchers.get(provider) or self.fetchers[""]

    def breaker(self, provider: str) -> CircuitBreaker:
        if provider not in self.breakers:
            fc = self.config.fetch
            self.breakers[provider] = CircuitBreaker(fc.breaker_failures, fc.breaker_open_seconds)
        return self.breakers[provider]


class FetchStage:
    """The ``fetch`` job: one provider output from FETCH_PENDING to STORED.

    Owns the output's row while its job runs (every move fenced by the job's lease), its
    fetch attempts, the refresh of its URL through the provider adapter, the object at its
    quarantine key (``fetch_transfer``), and the QUARANTINED asset with its probe job, made
    in the statement that marks the output STORED. Never touches the media (the probe job
    reads it), an asset once made, or the generation itself: it never submits, cancels or
    polls a provider task."""

    def __init__(self, services: FetchServices) -> None:
        self.services = services

    async def handle(
        self, _ctx: JobContext, job: Job, *, metrics: WorkerMetrics | None = None
    ) -> dict[str, Any] | None:
        token = records.current_job.set(job)
        try:
            return await self._handle(job, metrics)
        finally:
            records.current_job.reset(token)

    async def _handle(self, job: Job, metrics: WorkerMetrics | None) -> dict[str, Any] | None:
        output_id = uuid.UUID(str(job.payload["provider_output_id"]))
        output = await records.load(self.services.pool, output_id)
        if output.fetch_status == "STORED":
            return {"outcome": "already_stored"}
        if output.fetch_status in ("OUTPUT_LOST", "INVALID_RESPONSE"):
            return {"outcome": output.fetch_status.lower()}
        key = keys.quarantine_source(output.tenant_id, output.id, job.id)
        breaker = self.services.breaker(output.provider)
        wait = breaker.acquire()
        if wait > 0:
            raise DeferredError(
                f"circuit open for provider {output.provider}", retry_after_seconds=wait
            )
        url = self._url(output)
        if output.fetch_status in ("NEED_URL_REFRESH",) or records.expired(output):
            refreshed = await self._refresh(output, "url expired before the fetch")
            if refreshed is None:
                return {"outcome": "output_lost"}
            output, url = refreshed
        if output.fetch_status != "FETCHING":
            output, attempt_id = await records.start_fetching(self.services.pool, output, job)
            url = self._url(output)
        else:
            attempt_id = await records.begin_attempt(self.services.pool, output, job)
        refreshed_once = False
        while True:
            try:
                info, result = await self._transfer(output).into_store(output, url, key, metrics)
                breaker.success()
                break
            except (UrlExpiredError, NotYetAvailableError) as exc:
                not_yet = isinstance(exc, NotYetAvailableError)
                if not_yet and job.attempts < self.services.config.fetch.not_yet_available_attempts:
                    await self._fail(output, job, exc, attempt_id, key)
                    raise
                if refreshed_once:
                    await self._fail(output, job, exc, attempt_id, key)
                    raise TransientError(f"a fresh URL was refused too: {exc.detail}") from None
                try:
                    output = await records.move(
                        self.services.pool, output, "NEED_URL_REFRESH", error=exc
                    )
                    refreshed = await self._refresh(output, exc.detail)
                    if refreshed is None:
                        await records.end_attempt(
                            self.services.pool, attempt_id, "output_lost", exc
                        )
                        return {"outcome": "output_lost"}
                    output, url = refreshed
                    output = await records.move(self.services.pool, output, "FETCHING")
                except AivedioError as refresh_error:
                    # The refresh itself failed (the provider's API is down, throttling, a
                    # conflict): record it like any failure; the next attempt refreshes again.
                    output = await records.load(self.services.pool, output.id)
                    await self._fail(output, job, refresh_error, attempt_id, key)
                    raise
                refreshed_once = True
            except AivedioError as exc:
                if isinstance(exc, ProviderServerError | TransientError):
                    breaker.failure()
                else:
                    breaker.success()  # the provider answered; its circuit is healthy
                if isinstance(exc, ThrottledError):
                    self.services.hosts.throttled(host_of(url))
                await self._fail(output, job, exc, attempt_id, key)
                raise
        asset_id = await self._stored(output, job, key, info, result, attempt_id)
        return {
            "outcome": "stored",
            "asset_id": str(asset_id),
            "bytes": info.size,
            "sha256": result.sha256 if result else None,
            "resumes": getattr(result, "resumes", 0),
            "restarts": getattr(result, "restarts", 0),
        }

    def _transfer(self, output: OutputRow) -> Transfer:
        """The transfer of ``output``'s bytes, with its provider's fetcher and credential."""
        return Transfer(
            self.services.store,
            self.services.hosts,
            self.services.fetcher(output.provider),
            self.services.adapters.get(output.provider),
        )

    # -- records ---------------------------------------------------------------------------

    def _url(self, output: OutputRow) -> str:
        return self.services.cipher.decrypt(
            output.source_url_ciphertext, output.source_url_key_id, bound_to=str(output.id)
        )

    async def _refresh(self, output: OutputRow, why: str) -> tuple[OutputRow, str] | None:
        """A fresh URL from the provider, or OUTPUT_LOST (returns None)."""
        if output.fetch_status not in ("NEED_URL_REFRESH",):
            output = await records.move(
                self.services.pool, output, "NEED_URL_REFRESH", error=UrlExpiredError(why)
            )
        adapter = self.services.adapters.get(output.provider)
        try:
            if adapter is None:
                raise OutputLostError(
                    f"no adapter for provider {output.provider}: cannot refresh an expired URL"
                )
            fresh = await adapter.refresh_output_url(
                output.provider_task_id,
                output.output_index,
                expires_at=output.source_url_expires_at,
            )
        except OutputLostError as exc:
            await records.mark_lost(
                self.services.pool, output, exc.detail, ledger=self.services.config.ledger
            )
            return None
        except UrlExpiredError as exc:
            # 401/403 from the provider's own API is about our credentials, not the output:
            # retry (and let the operator see it), never end the output on it.
            raise TransientError(
                f"provider {output.provider} refused our API credentials: {exc.detail}"
            ) from None
        blob, key_id = self.services.cipher.encrypt(fresh.url, bound_to=str(output.id))
        async with acquired(self.services.pool) as conn, fenced(conn, records.current_job.get()):
            version = await transition(
                conn,
                Entity.PROVIDER_OUTPUT,
                (output.id,),
                expected="NEED_URL_REFRESH",
                new="FETCH_PENDING",
                version=output.version,
                values={
                    "source_url_ciphertext": blob,
                    "source_url_key_id": key_id,
                    "source_url_expires_at": fresh.expires_at,
                },
            )
            await provider_outputs.bump_descriptor_version(conn, output.id)
        log.info(
            "fetch_url_refreshed", provider_output_id=str(output.id), url=url_for_log(fresh.url)
        )
        output = msgspec.structs.replace(
            output,
            fetch_status="FETCH_PENDING",
            version=version,
            source_url_ciphertext=blob,
            source_url_key_id=key_id,
            source_url_expires_at=fresh.expires_at,
        )
        return output, fresh.url

    async def _fail(
        self, output: OutputRow, job: Job, error: AivedioError, attempt_id: int, key: str
    ) -> None:
        """Leave the output in the state the error calls for, as the queue will act on it."""
        qc = self.services.config.queue
        will_retry = decide_retry(
            retry_class=error.retry,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            base_seconds=1,
            max_seconds=qc.backoff_max_seconds,
        ).retry
        if output.fetch_status == "NEED_URL_REFRESH":
            # A refresh failed: the output waits for the next attempt's refresh, unless the
            # URL's expiry says it is lost.
            new = (
                "OUTPUT_LOST" if not will_retry and records.expired(output) else "NEED_URL_REFRESH"
            )
        elif isinstance(error, TooLargeError | PolicyBlockedError | InvalidResponseError):
            new = "INVALID_RESPONSE"
        elif will_retry:
            new = "RETRY_WAIT"
        elif error.retry is Retry.LIMITED and isinstance(error, ChecksumMismatchError):
            new = "INVALID_RESPONSE"
        elif records.expired(output):
            new = "OUTPUT_LOST"
        else:
            new = "RETRY_WAIT"  # budget spent: the dead job waits for an operator's replay
        with anyio.CancelScope(shield=True):
            await records.end_attempt(self.services.pool, attempt_id, "failed", error, key=key)
            try:
                if new == "OUTPUT_LOST":
                    await records.mark_lost(
                        self.services.pool,
                        output,
                        f"url expired after: {error.detail}",
                        ledger=self.services.config.ledger,
                    )
                elif output.fetch_status != new:
                    await records.move(self.services.pool, output, new, error=error)
            except (StaleStateError, LeaseLostError):
                # Another run moved the output meanwhile (stored it, most likely), or holds
                # the job now; its state stands. A retry of the job finds it and ends.
                new = (await records.load(self.services.pool, output.id)).fetch_status
        log.warning(
            "fetch_failed",
            provider_output_id=str(output.id),
            job_id=job.id,
            attempt=job.attempts,
            error_class=error.error_class,
            detail=error.detail,
            output_status=new,
        )

    async def _stored(
        self,
        output: OutputRow,
        job: Job,
        key: str,
        info: ObjectInfo,
        result: FetchResult | Resumed,
        attempt_id: int,
    ) -> uuid.UUID:
        asset_id = uuid.uuid4()
        job_now = records.current_job.get()
        # The probe's job in the same statement (a crash after it on the fetch job's last
        # attempt must not leave the asset without one), made only with the asset.
        probe = self.services.queue.enqueuing(
            [probe_spec(asset_id, output.tenant_id)],
            name="probe",
            when=provider_outputs.after("asset"),
        )
        assert probe is not None
        try:
            # One statement, fenced by the lease: it writes nothing unless the move to
            # STORED wins its compare-and-set (every other write reads ``stored``).
            async with self.services.pool.acquire() as conn:
                got = await write_fenced(
                    conn,
                    job_now,
                    {
                        # Serialise with a cancel of the task (it locks the task row first):
                        # either the cancel sees this asset, or the probe sees it cancelled.
                        "task": provider_outputs.share_task_part(output.generation_task_id),
                        "stored": transition_part(
                            Entity.PROVIDER_OUTPUT,
                            (output.id,),
                            expected=output.fetch_status,
                            new="STORED",
                            version=output.version,
                            values={"last_error_class": None, "last_error_detail": None},
                        ),
                        "asset": provider_outputs.stored_asset_part(
                            asset_id, output.tenant_id, output.id, key, info.size, result.sha256
                        ),
                        "attempt": records.end_attempt_part(
                            attempt_id,
                            "stored",
                            None,
                            result,
                            key,
                            when=provider_outputs.after("stored"),
                        ),
                        **probe.parts,
                    },
                    "recording the stored output",
                )
                probe.made(got)
                if got["stored"] is None:
                    raise stale(
                        Entity.PROVIDER_OUTPUT,
                        (output.id,),
                        expected=output.fetch_status,
                        new="STORED",
                        version=output.version,
                    )
                if got["asset"] is None:
                    # STORED is final and its asset is made with it, so a move that won
                    # finds none: should one exist anyway, it gets its probe here.
                    async with fenced(conn, job_now):
                        found = await _asset_of(conn, output.id)
                        asset_id = uuid.UUID(str(found))
                        await self.services.queue.enqueue_one(
                            conn, probe_spec(asset_id, output.tenant_id)
                        )
        except StaleStateError:
            # Another run of this job (its lease expired while we worked, say) stored it
            # first: same key, same verified bytes. One STORED, one asset: we are done too.
            current = await records.load(self.services.pool, output.id)
            if current.fetch_status != "STORED":
                raise
            asset = await provider_outputs.asset_of(self.services.pool, output.id)
            log.info("output_already_stored", provider_output_id=str(output.id), job_id=job.id)
            await records.end_attempt(
                self.services.pool, attempt_id, "already_stored", None, result, key
            )
            return uuid.UUID(str(asset))
        except asyncpg.PostgresError as exc:
            raise TransientError(f"recording the stored output failed: {exc}") from exc
        log.info(
            "output_stored",
            provider_output_id=str(output.id),
            asset_id=str(asset_id),
            job_id=job.id,
            bytes=info.size,
        )
        return asset_id


async def handle(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    stage = ctx.services.get("fetch")
    if not isinstance(stage, FetchStage):
        raise TransientError("this worker has no fetch stage configured")
    metrics = ctx.services.get("metrics")
    return await stage.handle(
        ctx, job, metrics=metrics if isinstance(metrics, WorkerMetrics) else None
    )


def register(registry: Registry) -> None:
    # An outer bound only: the fetcher's own total deadline (net.total_timeout_seconds, an
    # hour by default) ends a transfer first, and the stage then records the failure; the
    # job's deadline must stay well above it or it would cancel the stage before it can.
    registry.bind(jobs.FETCH, handle)


async def _asset_of(conn: Connection, output_id: uuid.UUID) -> Any:
    """The stored output's asset; a server error here is the store step's transient
    failure ("recording the stored output failed"), like the statements around it."""
    try:
        return await provider_outputs.asset_of(conn, output_id)
    except DatabaseError as exc:
        if isinstance(exc.__cause__, asyncpg.PostgresError):
            raise TransientError(
                f"recording the stored output failed: {exc.__cause__}"
            ) from exc.__cause__
        raise
