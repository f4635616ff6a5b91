"""Prometheus metrics of one worker process, in its own registry (no global state).

Degradation under backlog (``pipeline/backlog.py``), in both the worker's and the API's:
``aivedio_backlog_pressure{signal}`` (1 while on; ``signal`` is ``media_oldest_job``,
``outputs_near_expiry`` or ``any``), ``aivedio_media_oldest_job_age_seconds`` and
``aivedio_outputs_near_expiry`` (the readings). The worker adds
``aivedio_outputs_deferred_total{output}``, ``aivedio_poison_quarantined_total{kind}`` and
``aivedio_lane_slot_limit{lane}`` (the slots a lane may fill now); the API adds
``aivedio_uploads_refused_total``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


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

    def render(self) -> bytes:
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
