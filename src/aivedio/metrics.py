"""Prometheus metrics of one worker process, in its own registry (no global state).

Degradation under backlog (``pipeline/upkeep/backlog.py``), in both the worker's and the API's:
``aivedio_backlog_pressure{signal}`` (1 while on; ``signal`` is ``media_oldest_job``,
``outputs_near_expiry`` or ``any``), ``aivedio_media_oldest_job_age_seconds`` and
``aivedio_outputs_near_expiry`` (the readings). The worker adds
``aivedio_outputs_deferred_total{output}``, ``aivedio_poison_quarantined_total{kind}`` and
``aivedio_lane_slot_limit{lane}`` (the slots a lane may fill now); the API adds
``aivedio_uploads_refused_total``.

Upkeep (``supervision.py``), in both: ``aivedio_loop_failing{loop}`` (1 while a supervised
loop cannot work), ``aivedio_loop_failures_total{loop}`` and
``aivedio_scan_row_errors_total{scan}`` (rows a batch scan skipped); the worker adds
``aivedio_sweeps_total{outcome}`` (its sweep passes: ``swept``, ``incomplete``,
``another_sweeper_running``).

The scaling signals (what an autoscaler reads) that need more than the queue, each recorded where
its fact is known:

* fetch: ``aivedio_fetch_duration_seconds{provider}`` (request to stored object, transfers
  that stored their bytes) and ``aivedio_fetch_responses_total{provider,status}`` (the status
  that ended each download attempt; ``none`` when no status ended it: no connection, a
  policy refusal, a deadline, a body cut short); both recorded by the fetch stage, with
  ``aivedio_fetch_resumes_total{provider,kind}`` (bodies cut short that a download attempt
  continued with a 206, ``range``, or started over from byte 0, ``restart``);
* object store: ``aivedio_object_store_requests_total{operation,outcome}`` (``ok`` or the
  error class) and ``aivedio_object_store_bytes_total{direction}`` (``upload``,
  ``download``), recorded by ``store/objects/metered.py`` around the store the worker opens;
* ``aivedio_jobs_running_oldest_age_seconds{kind}``: this worker's running jobs, read at
  scrape time;
* real-time factor: ``aivedio_media_processing_seconds_total{path,mode}`` (ffmpeg wall
  seconds) over ``aivedio_media_source_seconds_total{path,mode}`` (source seconds those
  runs covered): a single-pass render covers the plan's duration, a chunk encode its chunk's
  span once however many renditions it made (as a render covers its source once).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric

from aivedio import transfer_cpu

# A provider download takes from well under a second (a short clip) to the fetcher's total
# deadline (an hour by default).
FETCH_DURATION_BUCKETS_SECONDS = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
# Label values of the media RTF counters (``Plan.path`` and ``Plan.mode``).
MEDIA_PATHS = ("single_pass", "chunked")
MEDIA_MODES = ("remux", "transcode")
# ``aivedio_fetch_responses_total{status}`` when no HTTP status ended the attempt.
NO_STATUS = "none"


class BacklogMetrics:
    """The pressure readings; the worker and the API each expose them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.pressure = Gauge(
            "aivedio_backlog_pressure",
            "1 while the backlog signal is on (signal: media_oldest_job, outputs_near_expiry, any)",
            ["signal"],
            registry=r,
        )
        self.media_oldest = Gauge(
            "aivedio_media_oldest_job_age_seconds",
            "Age of the oldest queued job of the media lane, as last read",
            registry=r,
        )
        self.near_expiry = Gauge(
            "aivedio_outputs_near_expiry",
            "Provider outputs not yet stored whose URL expires within the window, as last read",
            registry=r,
        )
        self.checked = Gauge(
            "aivedio_backlog_checked_timestamp_seconds",
            "When the pressure was last read (Unix time)",
            registry=r,
        )


class SupervisionMetrics:
    """Supervised loops and isolated rows (``supervision.py``); the worker and the API each
    expose them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.loop_failing = Gauge(
            "aivedio_loop_failing",
            "1 while a supervised loop cannot work (its next success clears it; /readyz says why)",
            ["loop"],
            registry=registry,
        )
        self.loop_failures = Counter(
            "aivedio_loop_failures",
            "Failures of supervised loops (each backed off and ran again)",
            ["loop"],
            registry=registry,
        )
        self.scan_row_errors = Counter(
            "aivedio_scan_row_errors",
            "Rows a batch scan skipped because their work raised (scan_row_failed events)",
            ["scan"],
            registry=registry,
        )


class StoreMetrics:
    """Object store calls through the seam (``store/objects/metered.py`` records them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "aivedio_object_store_requests",
            "Object store calls by operation and outcome (ok, or the error class)",
            ["operation", "outcome"],
            registry=registry,
        )
        self.bytes = Counter(
            "aivedio_object_store_bytes",
            "Bytes written to (upload) or read from (download) the object store",
            ["direction"],
            registry=registry,
        )


class ByteTransferCpu:
    """``aivedio_byte_transfer_cpu_seconds_total{kind}``: the process's CPU spent moving and
    hashing bytes (``transfer_cpu``), read at each scrape. Beside the process's own CPU
    (``/proc/PID/stat``) it splits a worker's CPU into byte transfer and the rest."""

    def collect(self) -> list[Metric]:
        family = CounterMetricFamily(
            "aivedio_byte_transfer_cpu_seconds",
            "CPU seconds this process spent moving and hashing bytes (store, fetch, hash)",
            labels=["kind"],
        )
        for kind, seconds in transfer_cpu.seconds().items():
            family.add_metric([kind], seconds)
        return [family]


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.claimed = Counter("aivedio_jobs_claimed", "Jobs claimed", ["kind"], registry=r)
        self.succeeded = Counter("aivedio_jobs_succeeded", "Jobs completed", ["kind"], registry=r)
        self.failed = Counter(
            "aivedio_jobs_failed", "Job attempts that failed", ["kind", "error_class"], registry=r
        )
        self.retried = Counter(
            "aivedio_jobs_retried", "Jobs scheduled to retry", ["kind"], registry=r
        )
        self.dead = Counter(
            "aivedio_jobs_dead", "Jobs moved to the dead state", ["kind"], registry=r
        )
        self.released = Counter(
            "aivedio_jobs_released", "Leases released on drain", ["kind"], registry=r
        )
        self.completion_refused = Counter(
            "aivedio_jobs_completion_refused",
            "Completions refused because the lease was lost (fencing)",
            ["kind"],
            registry=r,
        )
        self.lease_expiries = Counter(
            "aivedio_lease_expiries", "Expired leases this worker reaped", ["kind"], registry=r
        )
        self.slots_busy = Gauge("aivedio_lane_slots_busy", "Busy slots", ["lane"], registry=r)
        self.slots_total = Gauge("aivedio_lane_slots", "Configured slots", ["lane"], registry=r)
        self.queue_depth = Gauge("aivedio_queue_depth", "Queued jobs", ["kind"], registry=r)
        self.queue_oldest = Gauge(
            "aivedio_queue_oldest_age_seconds",
            "Age of the oldest ready job",
            ["kind"],
            registry=r,
        )
        self.draining = Gauge("aivedio_worker_draining", "1 while draining", registry=r)
        self.network_isolated = Gauge(
            "aivedio_sandbox_network_isolated",
            "1 if this worker's ffmpeg runs in its own network namespace, 0 if not "
            "(mode: media.network_isolation)",
            ["mode"],
            registry=r,
        )
        self.backlog = BacklogMetrics(r)
        self.slot_limit = Gauge(
            "aivedio_lane_slot_limit",
            "Slots a lane may fill now (configured, adjusted under backlog pressure)",
            ["lane"],
            registry=r,
        )
        self.outputs_deferred = Counter(
            "aivedio_outputs_deferred",
            "Optional outputs deferred under backlog pressure (each output once)",
            ["output"],
            registry=r,
        )
        self.poison_quarantined = Counter(
            "aivedio_poison_quarantined",
            "Assets quarantined as poison media (crashed their media jobs too often)",
            ["kind"],
            registry=r,
        )
        self.running_oldest = Gauge(
            "aivedio_jobs_running_oldest_age_seconds",
            "Seconds since this worker claimed its oldest running job of the kind (0: none)",
            ["kind"],
            registry=r,
        )
        self.fetch_duration = Histogram(
            "aivedio_fetch_duration_seconds",
            "Provider downloads that stored their bytes: request to completed upload",
            ["provider"],
            buckets=FETCH_DURATION_BUCKETS_SECONDS,
            registry=r,
        )
        self.fetch_responses = Counter(
            "aivedio_fetch_responses",
            "Download attempts by the HTTP status that ended them (none: no status did)",
            ["provider", "status"],
            registry=r,
        )
        self.fetch_resumes = Counter(
            "aivedio_fetch_resumes",
            "Bodies cut short and continued by a 206 (kind=range) or started over (restart)",
            ["provider", "kind"],
            registry=r,
        )
        self.store = StoreMetrics(r)
        self.supervision = SupervisionMetrics(r)
        self.sweeps = Counter(
            "aivedio_sweeps",
            "Sweep passes this worker ran, by outcome (swept, incomplete: a scan failed, "
            "another_sweeper_running)",
            ["outcome"],
            registry=r,
        )
        self.media_processing = Counter(
            "aivedio_media_processing_seconds",
            "Wall seconds of the media tools (ffmpeg, ffprobe) of renders and chunk pieces",
            ["path", "mode"],
            registry=r,
        )
        self.media_source = Counter(
            "aivedio_media_source_seconds",
            "Source seconds the renders and chunk pieces of media_processing covered",
            ["path", "mode"],
            registry=r,
        )
        r.register(ByteTransferCpu())
        self._before_scrape: list[Callable[[], None]] = []

    def media_processed(
        self, path: str, mode: str, processing_seconds: float, source_seconds: float
    ) -> None:
        """One render (``path`` single_pass, or chunked for the outputs rendered from the
        source) or one chunk piece finished its tools: the real-time factor is the rate of
        the first counter over the rate of the second."""
        self.media_processing.labels(path, mode).inc(max(processing_seconds, 0.0))
        self.media_source.labels(path, mode).inc(max(source_seconds, 0.0))

    def before_scrape(self, refresh: Callable[[], None]) -> None:
        """Run ``refresh`` at each scrape, before the text is made (gauges read from the
        process's state at that moment)."""
        self._before_scrape.append(refresh)

    def render(self) -> bytes:
        for refresh in self._before_scrape:
            refresh()
        return generate_latest(self.registry)


class ApiMetrics:
    """Prometheus metrics of one API process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "aivedio_api_requests", "Requests answered", ["route", "status"], registry=r
        )
        self.callbacks = Counter(
            "aivedio_api_callbacks", "Provider callbacks", ["provider", "outcome"], registry=r
        )
        self.media_bytes = Counter(
            "aivedio_api_media_bytes", "Bytes served by the playback gateway", registry=r
        )
        self.event_streams = Gauge(
            "aivedio_api_event_streams", "Open Server-Sent Event streams", registry=r
        )
        self.draining = Gauge("aivedio_api_draining", "1 while draining", registry=r)
        self.backlog = BacklogMetrics(r)
        self.uploads_refused = Counter(
            "aivedio_uploads_refused", "POST /v1/videos refused under backlog pressure", registry=r
        )
        self.rate_limited = Counter(
            "aivedio_api_rate_limited",
            "Requests refused 429 by a rate limit (key, address, auth_failure, callback)",
            ["scope"],
            registry=r,
        )
        self.supervision = SupervisionMetrics(r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
