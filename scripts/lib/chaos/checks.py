"""The invariants, read from the database, the object store and the log files, never from
what the processes said they did.

Each check returns a :class:`Result` (name, ok, detail, and the offending rows or keys). The
outcome of each output (the asset's state when it has an asset, else the output's fetch
state) is compared with what its fault calls for in ``outcomes``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos.plan import Plan
from chaos.stack import sql

FINAL = frozenset(
    {
        "ENRICHED",
        "INVALID_MEDIA",
        "PROCESSING_FAILED",
        "REJECTED",
        "DELETED",
        "INVALID_RESPONSE",
        "OUTPUT_LOST",
    }
)


@dataclass
class Result:
    name: str
    ok: bool
    detail: str
    offenders: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "offenders": [str(o) for o in self.offenders[:50]],
        }


OUTCOMES = """
SELECT o.provider_task_id, o.id AS output_id, o.fetch_status, o.last_error_class AS fetch_error,
       g.provider_status, a.id AS asset_id, a.status AS asset_status,
       a.last_error_class AS asset_error, a.deleted_at
FROM provider_outputs o JOIN generation_tasks g ON g.id = o.generation_task_id
LEFT JOIN assets a ON a.source_provider_output_id = o.id
WHERE o.provider = 'sim'
"""


def outcome_of(row: dict[str, Any]) -> str:
    return str(row["asset_status"] or row["fetch_status"])


def settled(row: dict[str, Any]) -> bool:
    state = outcome_of(row)
    # A cancelled task's published asset keeps what was released before the cancel; one whose
    # optional output the poison rule failed keeps its first release.
    return state in FINAL or (
        state == "PLAYABLE"
        and (row["provider_status"] == "CANCELLED" or row["asset_error"] == "poison_media")
    )


def snapshot(dsn: str) -> dict[str, dict[str, Any]]:
    return {r["provider_task_id"]: r for r in sql(dsn, OUTCOMES)}


# -- outcomes --------------------------------------------------------------------------------


def outcomes(
    plan: Plan, dsn: str, records: dict[str, dict[str, Any]], killed_owners: set[str]
) -> tuple[list[dict[str, Any]], list[Result]]:
    """Per output: its state against its fault's expectation; the cancel and delete races
    checked against the release times."""
    rows = snapshot(dsn)
    per_task = "SELECT provider_task_id, count(*) AS n FROM provider_outputs GROUP BY 1"
    counts = {r["provider_task_id"]: r["n"] for r in sql(dsn, per_task)}
    releases: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in sql(dsn, "SELECT asset_id, revision, published_at FROM releases"):
        releases[r["asset_id"]].append(r)
    crashes: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in sql(dsn, "SELECT asset_id, job_id, kind, cause, detail FROM media_crashes"):
        crashes[r["asset_id"]].append(r)
    per_output: list[dict[str, Any]] = []
    wrong: list[str] = []
    missing: list[str] = []
    timing: list[str] = []
    for output in plan.outputs:
        row = rows.get(output.task_id)
        rec = records.get(output.task_id, {})
        if row is None:
            missing.append(
                f"{output.task_id} ({output.kind}): no provider output recorded; "
                f"callback answers {rec.get('callback')}"
            )
            per_output.append(
                {"task_id": output.task_id, "kind": output.kind, "state": "MISSING", "ok": False}
            )
            continue
        state = outcome_of(row)
        ok = state in output.fault.expect
        why = ""
        if state in ("PROCESSING_FAILED", "PLAYABLE") and row["asset_error"] == "poison_media":
            # The poison rule counts a worker dying mid-job as a crash of the source: accepted
            # only when every crash it counted is a lease lost by a worker the harness killed.
            mine = crashes.get(row["asset_id"], [])
            by_kill = [
                c
                for c in mine
                if c["cause"] == "lease_expired"
                and any(o in (c["detail"] or "") for o in killed_owners)
            ]
            if mine and len(by_kill) == len(mine):
                ok, state = True, f"{state} (poison: SIGKILLs)"
            else:
                why = f"poison media not explained by the harness's kills: {mine}"
        rel = releases.get(row["asset_id"], [])
        for action in ("cancel", "delete"):
            done = rec.get(action)
            if not done:
                continue
            if not done.get("ok"):
                ok, why = False, f"the {action} was never accepted: {done}"
                continue
            after = [r for r in rel if r["published_at"].timestamp() > done["t_end"] + 0.5]
            if after:
                timing.append(
                    f"{output.task_id}: revision(s) {[r['revision'] for r in after]} "
                    f"released after the {action} returned"
                )
            if action == "cancel" and state in ("PLAYABLE", "ENRICHED"):
                before = [r for r in rel if r["published_at"].timestamp() <= done["t_end"] + 0.5]
                if not before:
                    ok, why = False, "published, but nothing was released before the cancel"
            if action == "cancel" and state == "DELETED" and row["asset_error"] != "cancelled":
                ok, why = False, f"DELETED with last_error_class {row['asset_error']!r}"
        if rec.get("error"):
            ok, why = False, f"the harness's action for it failed: {rec['error']}"
        dup = rec.get("duplicate")
        if dup is not None and dup.get("status") != dup.get("expect"):
            ok, why = False, f"duplicate callback answered {dup.get('status')}, not {dup['expect']}"
        if counts.get(output.task_id, 0) != 1:
            ok, why = False, f"{counts.get(output.task_id)} provider output rows"
        if not ok:
            wrong.append(
                f"{output.task_id} ({output.kind}): {state}, expected "
                f"{'/'.join(output.fault.expect)}{'; ' + why if why else ''}"
            )
        per_output.append(
            {
                "task_id": output.task_id,
                "kind": output.kind,
                "state": state,
                "ok": ok,
                "why": why,
                "fetch_status": row["fetch_status"],
                "asset_id": str(row["asset_id"]) if row["asset_id"] else None,
                "asset_error": row["asset_error"],
                "fetch_error": row["fetch_error"],
            }
        )
    results = [
        Result(
            "every output recorded (one callback accepted each)",
            not missing,
            f"{len(plan.outputs) - len(missing)}/{len(plan.outputs)} recorded",
            missing,
        ),
        Result(
            "every output in the final state its fault calls for",
            not wrong,
            f"{len(plan.outputs) - len(wrong) - len(missing)}/{len(plan.outputs)} as expected",
            wrong,
        ),
        Result(
            "nothing released after a cancel or delete returned",
            not timing,
            f"{sum(1 for r in records.values() if r.get('cancel') or r.get('delete'))} "
            "cancels and deletes checked",
            timing,
        ),
    ]
    return per_output, results


# -- the database's own invariants -------------------------------------------------------------


def uniqueness(dsn: str) -> list[Result]:
    two_outputs = sql(
        dsn,
        "SELECT provider, provider_task_id, output_index, count(*) AS n"
        " FROM provider_outputs GROUP BY 1, 2, 3 HAVING count(*) > 1",
    )
    two_assets = sql(
        dsn,
        "SELECT source_provider_output_id, count(*) AS n FROM assets"
        " WHERE source_provider_output_id IS NOT NULL GROUP BY 1"
        " HAVING count(*) > 1",
    )
    # One publish makes one revision: at most one released first revision per asset (there
    # is no reprocess here), and at most one released enrichment of any revision.
    two_revisions = sql(
        dsn,
        """
        SELECT r.asset_id, coalesce(r.enriches, 0) AS base, array_agg(r.revision) AS revisions
        FROM asset_revisions r JOIN releases l USING (asset_id, revision)
        GROUP BY 1, 2 HAVING count(*) > 1""",
    )
    twice = sql(
        dsn,
        """
        SELECT aggregate_id, payload->>'revision' AS revision, count(*) AS n FROM outbox_events
        WHERE event_type = 'asset.ready' GROUP BY 1, 2 HAVING count(*) > 1""",
    )
    unreleased_ready = sql(
        dsn,
        """
        SELECT r.asset_id, r.revision, r.status FROM asset_revisions r
        LEFT JOIN releases l USING (asset_id, revision)
        WHERE (r.status IN ('READY', 'SUPERSEDED')) <> (l.asset_id IS NOT NULL)""",
    )
    pointer = sql(
        dsn,
        """
        SELECT a.id, a.status, a.current_revision, r.status AS revision_status FROM assets a
        LEFT JOIN asset_revisions r ON r.asset_id = a.id AND r.revision = a.current_revision
        WHERE (a.status IN ('PLAYABLE', 'ENRICHED') AND coalesce(r.status, '') <> 'READY')
           OR (a.current_revision IS NOT NULL AND a.status <> 'DELETED'
               AND (SELECT count(*) FROM asset_revisions x WHERE x.asset_id = a.id
                    AND x.status = 'READY') <> 1)""",
    )
    return [
        Result(
            "no provider output recorded twice",
            not two_outputs,
            f"{len(two_outputs)} duplicated",
            two_outputs,
        ),
        Result(
            "no provider output has two assets",
            not two_assets,
            f"{len(two_assets)} with two or more",
            two_assets,
        ),
        Result(
            "no asset has two revisions from one publish",
            not two_revisions,
            f"{len(two_revisions)} found",
            two_revisions,
        ),
        Result(
            "no revision was published twice (asset.ready per revision)",
            not twice,
            f"{len(twice)} found",
            twice,
        ),
        Result(
            "released ⇔ READY/SUPERSEDED; the pointer names the one READY revision",
            not unreleased_ready and not pointer,
            f"{len(unreleased_ready)} revision/release mismatches, {len(pointer)} pointers",
            unreleased_ready + pointer,
        ),
    ]


def leftovers(dsn: str) -> list[Result]:
    building = sql(
        dsn,
        """
        SELECT r.asset_id, r.revision, a.status FROM asset_revisions r JOIN assets a
        ON a.id = r.asset_id WHERE r.status = 'BUILDING'""",
    )
    live = sql(
        dsn, "SELECT kind, status, count(*) AS n FROM jobs WHERE kind <> 'sweep' GROUP BY 1, 2"
    )
    return [
        Result(
            "no revision left BUILDING once every asset settled",
            not building,
            f"{len(building)} found",
            building,
        ),
        Result(
            "no job left queued, waiting or running (sweep jobs aside)",
            not live,
            ", ".join(f"{r['kind']}/{r['status']}: {r['n']}" for r in live) or "none",
            live,
        ),
    ]


def expired_leases(dsn: str) -> list[dict[str, Any]]:
    return sql(
        dsn,
        "SELECT id, kind, lease_owner, lease_token, lease_until FROM jobs"
        " WHERE status = 'running' AND lease_until < now()",
    )


# -- the store ---------------------------------------------------------------------------------

REFERENCED = """
SELECT a.id AS asset_id, a.status AS asset_status, r.revision, r.status AS revision_status,
       v.variant_type, v.object_key, v.size_bytes, v.checksum, v.status AS variant_status,
       v.extra
FROM assets a JOIN asset_revisions r ON r.asset_id = a.id
JOIN asset_variants v ON v.asset_id = r.asset_id AND v.revision = r.revision
"""
SOURCES = """
SELECT id, status, source_object_key, source_size_bytes, source_sha256, source_retain_until,
       last_error_class FROM assets WHERE source_object_key IS NOT NULL
"""
_REV = re.compile(r"(.*?/rev/[0-9]+)/")


def _files(row: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(key, size, sha256) of every file a variant references."""
    import json

    extra = row["extra"]
    if isinstance(extra, str):
        extra = json.loads(extra)
    found = _REV.match(row["object_key"])
    files = (extra or {}).get("files") or []
    if not files or not found:
        return [(row["object_key"], row["size_bytes"], row["checksum"])]
    return [(f"{found.group(1)}/{f['path']}", int(f["size"]), str(f["sha256"])) for f in files]


def _playlist_uris(text: str) -> list[str]:
    uris = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            uris += re.findall(r'URI="([^"]+)"', line)
        else:
            uris.append(line)
    return uris


async def _store_checks(
    config_path: Path,
    rows: list[dict[str, Any]],
    sources: list[dict[str, Any]],
    now: datetime,
    sweep_at: datetime,
    grace: float,
) -> list[Result]:
    from aivedio.config.load import load_config
    from aivedio.store.objects.opening import open_object_store

    config = load_config(config_path, environ={}, require_secrets=False)
    async with open_object_store(config.storage) as store:
        listed = {info.key: info async for info in store.list("")}
        pending = await store.list_multipart_uploads("")
        # 1. every object a READY revision references: present, its size, its SHA-256.
        bad: list[str] = []
        checked = 0
        ready_files: dict[str, tuple[int, str]] = {}
        for row in rows:
            if row["revision_status"] != "READY" or row["asset_status"] == "DELETED":
                continue
            if row["variant_status"] != "SUCCEEDED":
                continue
            for key, size, sha in _files(row):
                ready_files[key] = (size, sha)
        for key, (size, sha) in sorted(ready_files.items()):
            checked += 1
            info = listed.get(key)
            if info is None:
                bad.append(f"{key}: missing")
                continue
            if info.size != size:
                bad.append(f"{key}: {info.size} bytes, recorded {size}")
                continue
            data = await store.get_bytes(key)
            if hashlib.sha256(data).hexdigest() != sha:
                bad.append(f"{key}: SHA-256 differs from the recorded one")
        # 2. every published playlist's URIs resolve to objects that exist.
        broken: list[str] = []
        playlists = 0
        todo = [k for k in ready_files if k.endswith("master.m3u8")]
        seen: set[str] = set()
        while todo:
            key = todo.pop()
            if key in seen:
                continue
            seen.add(key)
            playlists += 1
            if key not in listed:
                broken.append(f"{key}: playlist missing")
                continue
            text = (await store.get_bytes(key)).decode("utf-8", "replace")
            base = key.rsplit("/", 1)[0]
            for uri in _playlist_uris(text):
                if "://" in uri or uri.startswith("/") or ".." in uri.split("/"):
                    broken.append(f"{key}: URI {uri!r} is not relative")
                    continue
                target = f"{base}/{uri}"
                if target not in listed:
                    broken.append(f"{key}: {uri} missing")
                elif target.endswith(".m3u8"):
                    todo.append(target)
        # 3. orphans: what the database references (GC roots) against what is stored.
        needed: set[str] = set()
        prefixes: list[str] = []
        for row in rows:
            if row["asset_status"] == "DELETED":
                continue
            if row["revision_status"] in ("READY", "SUPERSEDED") and row["object_key"]:
                needed.update(key for key, _, _ in _files(row))
            if row["revision_status"] == "BUILDING":
                prefixes.append(row["object_key"].split("/rev/")[0] + f"/rev/{row['revision']}/")
        retained = 0
        for src in sources:
            keep = src["status"] != "DELETED" or (
                src["source_retain_until"] is not None and src["source_retain_until"] > now
            )
            if keep:
                needed.add(src["source_object_key"])
                retained += src["status"] == "DELETED"
        orphans = []
        young = 0
        for key, info in sorted(listed.items()):
            if key in needed or any(key.startswith(p) for p in prefixes):
                continue
            if (
                info.last_modified is not None
                and (sweep_at - info.last_modified).total_seconds() < grace
            ):
                young += 1
                continue
            orphans.append(f"{key} ({info.size} bytes, {info.last_modified:%H:%M:%S})")
        missing_sources = [
            s["source_object_key"]
            for s in sources
            if s["source_object_key"] in needed and s["source_object_key"] not in listed
        ]
    return [
        Result(
            "every object of a READY revision exists with its recorded size and SHA-256",
            not bad,
            f"{checked} objects read and hashed",
            bad,
        ),
        Result(
            "no published playlist references a missing object",
            not broken,
            f"{playlists} playlists parsed",
            broken,
        ),
        Result(
            "no orphan object left after GC past the grace period",
            not orphans,
            f"{len(listed)} objects stored, {len(needed)} referenced, {retained} cancelled "
            f"sources retained by rule, {young} younger than the grace at the sweep",
            orphans,
        ),
        Result(
            "every retained source object exists",
            not missing_sources,
            f"{len(sources)} sources recorded",
            missing_sources,
        ),
        Result(
            "no multipart upload left open",
            not pending,
            f"{len(pending)} open",
            [f"{p.key} {p.upload_id}" for p in pending],
        ),
    ]


def store_checks(config_path: Path, dsn: str, sweep_at: datetime, grace: float) -> list[Result]:
    rows, sources, now = sql(dsn, REFERENCED), sql(dsn, SOURCES), datetime.now(UTC)
    return asyncio.run(_store_checks(config_path, rows, sources, now, sweep_at, grace))


# -- logs --------------------------------------------------------------------------------------

_HEX64 = re.compile(rb"[0-9a-f]{64}")


def secrets_in_logs(logs: list[Path], signatures: set[str], secrets: dict[str, str]) -> Result:
    """No URL signature, query string, token or key appears in any log file."""
    found: list[str] = []
    sigs = {s.encode() for s in signatures}
    needles = {name: value.encode() for name, value in secrets.items() if len(value) >= 8}
    lines = 0
    for log in logs:
        if not log.is_file():
            continue
        data = log.read_bytes()
        lines += data.count(b"\n")
        for match in set(_HEX64.findall(data)):
            if match in sigs:
                found.append(f"{log.name}: a provider URL signature ({match[:8].decode()}…)")
        for name, needle in needles.items():
            if needle in data:
                found.append(f"{log.name}: {name}")
        for marker in (b"sig=", b"X-Amz-Signature", b"X-Amz-Credential"):
            if marker in data:
                found.append(f"{log.name}: a signed query string ({marker.decode()})")
    return Result(
        "no signed URL, token or key in any log line",
        not found,
        f"{len(logs)} log files, {lines} lines, {len(signatures)} URL signatures "
        f"and {len(needles)} secrets searched",
        sorted(set(found)),
    )


# Deferred outputs of assets not deleted, by status and by their revision's fate: a revision
# that ended otherwise (FAILED, ABANDONED, SUPERSEDED before its enrichment) leaves its
# outputs as they were, which is no fault of the deferral. Released: the enrichment revision
# of theirs holds the output SUCCEEDED.
DEFERRED_OUTPUTS = """
SELECT v.status, r.status IN ('BUILDING', 'READY') AS live, count(*) AS n,
       count(*) FILTER (WHERE EXISTS (
           SELECT 1 FROM asset_revisions e JOIN asset_variants ev
             ON ev.asset_id = e.asset_id AND ev.revision = e.revision
           WHERE e.asset_id = v.asset_id AND e.enriches = v.revision
             AND e.status IN ('READY', 'SUPERSEDED')
             AND ev.variant_type = v.variant_type AND ev.status = 'SUCCEEDED')) AS released
FROM asset_variants v JOIN asset_revisions r USING (asset_id, revision)
JOIN assets a ON a.id = v.asset_id
WHERE v.deferred_at IS NOT NULL AND a.status <> 'DELETED'
GROUP BY 1, 2
"""


def degradation(dsn: str, events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Result]:
    """What degradation under backlog did in the run, from the workers' logs (each worker's
    turns of the pressure, the deferral looks) and the database (the outputs deferred and how
    they ended, the sources quarantined as poison); and the invariant that no deferred output
    of a live revision was left pending. Uploads are not part of the run (callbacks are never
    refused)."""
    on = [e for e in events if e.get("event") == "backlog_pressure_on"]
    signals = sorted({s for e in on for s in e.get("signals", [])})
    looks = sum(
        1
        for e in events
        if e.get("event") == "job_deferred" and e.get("error_class") == "backlog_deferred"
    )
    rows = sql(dsn, DEFERRED_OUTPUTS)
    by_status: Counter[str] = Counter()
    released = 0
    for row in rows:
        by_status[row["status"]] += int(row["n"])
        released += int(row["released"])
    deferred = sum(by_status.values())
    pending = sum(int(r["n"]) for r in rows if r["status"] == "PENDING" and r["live"])
    poison = sql(
        dsn,
        "SELECT count(*) AS n FROM assets WHERE last_error_class = 'poison_media'"
        " AND status <> 'DELETED'",
    )
    table = [
        {
            "what": "backlog pressure turned on (each worker's turns)",
            "seen": str(len(on)),
            "detail": f"signals {', '.join(signals) or 'none'} (backlog_pressure_on)",
        },
        {
            "what": "optional outputs deferred",
            "seen": str(deferred),
            "detail": ", ".join(f"{status} {n}" for status, n in sorted(by_status.items()))
            + f"; {released} released by an enrichment"
            if deferred
            else "none",
        },
        {
            "what": "deferral looks (a job put back to wait)",
            "seen": str(looks),
            "detail": "job_deferred with error class backlog_deferred",
        },
        {
            "what": "sources quarantined as poison",
            "seen": str(poison[0]["n"]),
            "detail": "assets PROCESSING_FAILED or PLAYABLE with poison_media",
        },
    ]
    result = Result(
        "no deferred optional output of a live revision left pending",
        pending == 0,
        f"{deferred} deferred, {pending} still PENDING in a building or published revision",
    )
    return table, result


def count_by(items: list[dict[str, Any]], key: str) -> Counter[str]:
    return Counter(str(i[key]) for i in items)
