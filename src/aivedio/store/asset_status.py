"""An asset's state and the timeline of its stages, read from the records the stages keep.

One answer to "where is it and what happened", shared by ``aivedio status`` and the API:
the asset's state and current revision, each published variant of that revision, and the
timeline (fetch attempts, jobs with their outcome and error class, releases), oldest first.
Before an asset exists, ``output_status`` answers for the provider output it will come from:
its fetch state, URL expiry, last error and fetch attempts.

A timeline entry is a plain dict with ``at``, ``stage`` and ``event`` (and optional details);
the fetch entries of an output are the same dicts in both answers, so a reader that follows
an output and then its asset (``aivedio status --follow``) can tell which it has shown.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from aivedio.logs import redact_text
from aivedio.progress import percent
from aivedio.store.database import Pool

# States after which nothing more happens to an asset (DELETED is the tombstone).
FINAL_ASSET_STATES = frozenset(
    {"ENRICHED", "REJECTED", "INVALID_MEDIA", "PROCESSING_FAILED", "DELETED"}
)
# A provider output that ends here never gets an asset. (STORED is final too, but it is
# recorded in the transaction that creates the asset: from then on the asset answers.)
FINAL_OUTPUT_STATES_WITHOUT_ASSET = frozenset({"OUTPUT_LOST", "INVALID_RESPONSE"})


def _phases(job: Any) -> list[dict[str, Any]]:
    """A job that did several stages' work (the probe job's fast path: render, decode check
    and frames, moderation, publish) recorded each phase's start and length in its result:
    one timeline entry each, ``{job kind}:{phase}``, so a reader sees where the time went."""
    phases = job["phases"]
    started = job["started_at"]
    if not isinstance(phases, list) or started is None:
        return []
    entries = []
    for phase in phases:
        if not isinstance(phase, dict) or not isinstance(phase.get("phase"), str):
            continue
        at, seconds = phase.get("at_seconds"), phase.get("seconds")
        if not isinstance(at, int | float) or not isinstance(seconds, int | float):
            continue
        entries.append(
            {
                # When it was done, as the event says; ``seconds`` how long it took.
                "at": _iso(started + timedelta(seconds=at + seconds)),
                "stage": f"{job['kind']}:{phase['phase']}",
                "event": "done",
                "seconds": seconds,
            }
        )
    return entries


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


async def asset_status(pool: Pool, asset_id: uuid.UUID) -> dict[str, Any] | None:
    asset = await pool.fetchrow(
        "SELECT a.*, o.provider, o.provider_task_id, o.output_index, o.fetch_status"
        " FROM assets a LEFT JOIN provider_outputs o ON o.id = a.source_provider_output_id"
        " WHERE a.id = $1",
        asset_id,
    )
    if asset is None:
        return None
    revision = asset["current_revision"]
    variants = await pool.fetch(
        "SELECT v.variant_type, v.object_key, v.size_bytes, v.checksum, v.status, v.mime_type,"
        " v.extra->'c2pa' AS c2pa"
        " FROM asset_variants v JOIN asset_revisions r USING (asset_id, revision)"
        " WHERE v.asset_id = $1 AND v.revision = $2"
        " AND v.variant_type = ANY(coalesce(r.published_outputs, ARRAY[]::text[]))"
        " ORDER BY v.variant_type",
        asset_id,
        revision,
    )
    timeline: list[dict[str, Any]] = [
        {
            "at": _iso(asset["created_at"]),
            "stage": "asset",
            "event": "created",
            "source": asset["source_type"].lower(),
        }
    ]
    if asset["source_provider_output_id"] is not None:
        timeline.extend(await fetch_entries(pool, asset["source_provider_output_id"]))
    jobs = await pool.fetch(
        "SELECT kind, status, attempts, last_error_class, started_at, finished_at, payload,"
        " created_at, result->'phases' AS phases, NULL::real AS progress FROM job_history"
        " WHERE payload->>'asset_id' = $1"
        " UNION ALL SELECT kind, status, attempts, last_error_class, started_at, NULL,"
        " payload, created_at, NULL, progress FROM jobs WHERE payload->>'asset_id' = $1",
        str(asset_id),
    )
    for job in jobs:
        what = job["payload"].get("variant_type") or job["payload"].get("mode")
        timeline.append(
            {
                "at": _iso(job["started_at"] or job["created_at"]),
                "stage": job["kind"] + (f":{what}" if what else ""),
                "event": job["status"],
                "attempts": job["attempts"],
                "finished_at": _iso(job["finished_at"]),
                # A job that succeeded in the end (after a deferral or a retry)
                # did not fail: its last error would read like a failure.
                "error_class": None if job["status"] == "succeeded" else job["last_error_class"],
            }
        )
        timeline.extend(_phases(job))
    for release in await pool.fetch(
        "SELECT revision, previous_revision, published_at, outputs FROM releases"
        " WHERE asset_id = $1 ORDER BY published_at",
        asset_id,
    ):
        timeline.append(
            {
                "at": _iso(release["published_at"]),
                "stage": "publish",
                "event": "released",
                "revision": release["revision"],
                "previous_revision": release["previous_revision"],
                "outputs": list(release["outputs"]),
            }
        )
    timeline.sort(key=lambda entry: entry["at"] or "")
    return {
        "asset_id": str(asset_id),
        "state": asset["status"],
        "current_revision": revision,
        "moderation": asset["moderation_status"],
        "provider": asset["provider"],
        "provider_task_id": asset["provider_task_id"],
        "provider_output_id": _str(asset["source_provider_output_id"]),
        "output_index": asset["output_index"],
        "error_class": asset["last_error_class"],
        "error_detail": asset["last_error_detail"],
        "variants": [_variant(v) for v in variants],
        # The source's streams no output carries (more audio tracks than one, a cover
        # picture, subtitles), as the probe's verdict listed them.
        "ignored_streams": _ignored_streams(asset["probe"]),
        # The source's C2PA summary (read at the probe; None: not read) and each published
        # output's signing: ``pipeline/media/credentials.py`` makes them one summary.
        "source_provenance": asset["provenance"],
        "output_signing": {v["variant_type"]: v["c2pa"] for v in variants},
        "progress": progress_of(
            asset["status"], [job["progress"] for job in jobs if job["status"] == "running"]
        ),
        "timeline": timeline,
    }


def progress_of(state: str, measured: list[float | None]) -> float | None:
    """The asset's render progress as a percentage, as Cloudflare Stream's ``pctComplete``:
    its slowest running job's (``aivedio.progress``), 100 once ENRICHED (every output made),
    None when no job of it is measured (waiting, fetching, or nothing left to render)."""
    if state == "ENRICHED":
        return 100.0
    running = [m for m in measured if m is not None]
    return percent(min(running)) if running else None


async def progress_now(pool: Pool, asset_id: uuid.UUID) -> float | None:
    """``progress`` of ``asset_status`` alone: one short read for a stream to poll."""
    row = await pool.fetchrow(
        "SELECT a.status, array(SELECT j.progress FROM jobs j"
        " WHERE j.payload->>'asset_id' = $2 AND j.status = 'running') AS measured"
        " FROM assets a WHERE a.id = $1",
        asset_id,
        str(asset_id),
    )
    return None if row is None else progress_of(row["status"], list(row["measured"]))


async def fetch_entries(pool: Pool, provider_output_id: uuid.UUID) -> list[dict[str, Any]]:
    """The output's fetch attempts as timeline entries, oldest first (never a URL: the
    attempts keep scheme, host and a path hash only)."""
    return [
        {
            "at": _iso(attempt["started_at"]),
            "stage": "fetch",
            "event": attempt["outcome"] or "started",
            "attempt": attempt["attempt"],
            "finished_at": _iso(attempt["finished_at"]),
            "error_class": attempt["error_class"],
            "http_status": attempt["http_status"],
            "bytes": attempt["bytes"],
        }
        for attempt in await pool.fetch(
            "SELECT attempt, started_at, finished_at, outcome, error_class, http_status, bytes"
            " FROM fetch_attempts WHERE provider_output_id = $1 ORDER BY id",
            provider_output_id,
        )
    ]


async def output_status(pool: Pool, provider_output_id: uuid.UUID) -> dict[str, Any] | None:
    """A provider output's fetch state and attempts, and its asset's id once it has one (then
    ``asset_status`` of that id says the rest). None when there is no such output."""
    output = await pool.fetchrow(
        "SELECT o.*, t.provider_status AS task_state, a.id AS asset_id"
        " FROM provider_outputs o JOIN generation_tasks t ON t.id = o.generation_task_id"
        " LEFT JOIN assets a ON a.source_provider_output_id = o.id WHERE o.id = $1",
        provider_output_id,
    )
    if output is None:
        return None
    timeline: list[dict[str, Any]] = [
        {"at": _iso(output["created_at"]), "stage": "output", "event": "recorded"},
        *await fetch_entries(pool, provider_output_id),
    ]
    timeline.sort(key=lambda entry: entry["at"] or "")
    detail = output["last_error_detail"]
    return {
        "provider_output_id": str(provider_output_id),
        "asset_id": _str(output["asset_id"]),
        "state": output["fetch_status"],
        "provider": output["provider"],
        "provider_task_id": output["provider_task_id"],
        "output_index": output["output_index"],
        "generation_task_id": str(output["generation_task_id"]),
        "task_state": output["task_state"],
        "url_expires_at": _iso(output["source_url_expires_at"]),
        "expected_size_bytes": output["expected_size_bytes"],
        "error_class": output["last_error_class"],
        "error_detail": redact_text(detail) if detail else None,
        "timeline": timeline,
    }


def _ignored_streams(probe: Any) -> list[dict[str, Any]]:
    media = probe.get("media") if isinstance(probe, dict) else None
    ignored = media.get("ignored_streams") if isinstance(media, dict) else None
    return list(ignored) if isinstance(ignored, list) else []


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _variant(v: Any) -> dict[str, Any]:
    return {
        "variant_type": v["variant_type"],
        "object_key": v["object_key"],
        "size_bytes": v["size_bytes"],
        "sha256": v["checksum"],
        "mime_type": v["mime_type"],
    }
