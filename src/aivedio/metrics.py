"""Prometheus metrics of one worker process, in its own registry (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


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

    def render(self) -> bytes:
        return generate_latest(self.registry)
