"""``aivedio status (ASSET_ID | --task ID | --provider-output ID) [--json]``.

One answer to "where is it and what happened": the asset's state and current revision, each
variant of that revision (type, object key, size, SHA-256), and the timeline of its stages
(fetch attempts, jobs with their outcome and error class, releases), oldest first. With
``--task``, one such object per output of the generation task.
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import datetime
from typing import Any

import anyio

from aivedio.config import Config
from aivedio.store.database import Pool, map_db_errors, open_pool

EXIT_OK, EXIT_USAGE, EXIT_NOT_FOUND = 0, 2, 3


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
                         "error_class": job["last_error_class"]})  # fmt: skip
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


def _text(status: dict[str, Any]) -> str:
    lines = [
        f"asset {status['asset_id']}: {status['state']}, current revision "
        f"{status['current_revision']}, moderation {status['moderation']}"
        + (f", {status['error_class']}: {status['error_detail']}" if status["error_class"] else "")
    ]
    for v in status["variants"]:
        lines.append(f"  {v['variant_type']:<10} {v['size_bytes']:>10}  {v['sha256'][:16]}…  "
                     f"{v['object_key']}")  # fmt: skip
    for entry in status["timeline"]:
        error = f"  [{entry['error_class']}]" if entry.get("error_class") else ""
        lines.append(f"  {entry['at']}  {entry['stage']:<18} {entry['event']}{error}")
    return "\n".join(lines)


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    chosen = [x for x in (args.asset_id, args.task, args.provider_output) if x]
    if len(chosen) != 1:
        print("aivedio status: give exactly one of ASSET_ID, --task ID, --provider-output ID")
        return EXIT_USAGE

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=2) as pool:
            with map_db_errors("reading the status"):
                if args.task:
                    rows = await pool.fetch(
                        "SELECT a.id FROM assets a JOIN provider_outputs o"
                        " ON o.id = a.source_provider_output_id"
                        " WHERE o.provider_task_id = $1 ORDER BY o.output_index",
                        args.task,
                    )
                    ids = [r["id"] for r in rows]
                else:
                    try:
                        given = uuid.UUID(args.asset_id or args.provider_output)
                    except ValueError:
                        print("aivedio status: ids are UUIDs")
                        return EXIT_USAGE
                    if args.provider_output:
                        found = await pool.fetchval(
                            "SELECT id FROM assets WHERE source_provider_output_id = $1", given
                        )
                        ids = [found] if found else []
                    else:
                        ids = [given]
                statuses = [s for s in [await asset_status(pool, i) for i in ids] if s]
        if not statuses:
            print("aivedio status: nothing found")
            return EXIT_NOT_FOUND
        if args.json:
            print(json.dumps(statuses if args.task else statuses[0]))
        else:
            print("\n".join(_text(s) for s in statuses))
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    status = sub.add_parser("status", parents=[common], help="an asset's state and timeline")
    status.add_argument("asset_id", nargs="?")
    status.add_argument("--task", help="a provider task id: one status per output")
    status.add_argument("--provider-output", help="a provider output id")
    status.add_argument("--json", action="store_true")
    status.set_defaults(fn=cmd_status, needs_secret=False)
