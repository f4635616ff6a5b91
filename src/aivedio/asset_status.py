"""An asset's state and the timeline of its stages, read from the records the stages keep.

One answer to "where is it and what happened", shared by ``aivedio status`` and the API:
the asset's state and current revision, each published variant of that revision, and the
timeline (fetch attempts, jobs with their outcome and error class, releases), oldest first.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from aivedio.store.database import Pool


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
        "SELECT v.variant_type, v.object_key, v.size_bytes, v.checksum, v.status, v.mime_type"
        " FROM asset_variants v JOIN asset_revisions r USING (asset_id, revision)"
        " WHERE v.asset_id = $1 AND v.revision = $2"
        " AND v.variant_type = ANY(coalesce(r.published_outputs, ARRAY[]::text[]))"
        " ORDER BY v.variant_type",
        asset_id,
        revision,
    )
    timeline: list[dict[str, Any]] = [
        {"at": _iso(asset["created_at"]), "stage": "asset", "event": "created",
         "source": asset["source_type"].lower()}
    ]  # fmt: skip
    if asset["source_provider_output_id"] is not None:
        for attempt in await pool.fetch(
            "SELECT started_at, finished_at, outcome, error_class, http_status, bytes"
            " FROM fetch_attempts WHERE provider_output_id = $1 ORDER BY id",
            asset["source_provider_output_id"],
        ):
            entry = {"at": _iso(attempt["started_at"]), "stage": "fetch",
                     "event": attempt["outcome"] or "started",
                     "finished_at": _iso(attempt["finished_at"]),
                     "error_class": attempt["error_class"],
                     "http_status": attempt["http_status"], "bytes": attempt["bytes"]}  # fmt: skip
            timeline.append(entry)
    jobs = await pool.fetch(
        "SELECT kind, status, attempts, last_error_class, started_at, finished_at, payload,"
        " created_at FROM job_history WHERE payload->>'asset_id' = $1"
        " UNION ALL SELECT kind, status, attempts, last_error_class, started_at, NULL,"
        " payload, created_at FROM jobs WHERE payload->>'asset_id' = $1",
        str(asset_id),
    )
    for job in jobs:
        what = job["payload"].get("variant_type") or job["payload"].get("mode")
        timeline.append({"at": _iso(job["started_at"] or job["created_at"]),
                         "stage": job["kind"] + (f":{what}" if what else ""),
                         "event": job["status"], "attempts": job["attempts"],
                         "finished_at": _iso(job["finished_at"]),
                         # A job that succeeded in the end (after a deferral or a retry)
                         # did not fail: its last error would read like a failure.
                         "error_class": None if job["status"] == "succeeded"
                         else job["last_error_class"]})  # fmt: skip
    for release in await pool.fetch(
        "SELECT revision, previous_revision, published_at, outputs FROM releases"
        " WHERE asset_id = $1 ORDER BY published_at",
        asset_id,
    ):
        timeline.append({"at": _iso(release["published_at"]), "stage": "publish",
                         "event": "released", "revision": release["revision"],
                         "previous_revision": release["previous_revision"],
                         "outputs": list(release["outputs"])})  # fmt: skip
    timeline.sort(key=lambda entry: entry["at"] or "")
    return {
        "asset_id": str(asset_id),
        "state": asset["status"],
        "current_revision": revision,
        "moderation": asset["moderation_status"],
        "provider": asset["provider"],
        "provider_task_id": asset["provider_task_id"],
        "error_class": asset["last_error_class"],
        "error_detail": asset["last_error_detail"],
        "variants": [_variant(v) for v in variants],
        "timeline": timeline,
    }


def _variant(v: Any) -> dict[str, Any]:
    return {
        "variant_type": v["variant_type"],
        "object_key": v["object_key"],
        "size_bytes": v["size_bytes"],
        "sha256": v["checksum"],
        "mime_type": v["mime_type"],
    }
