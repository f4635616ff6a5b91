"""A text track added to a published video: a new revision that carries the current one's
outputs plus the track.

A published revision never changes (a player that loaded it keeps working), so a track
added later is released the way an enrichment is (``pipeline/publish.py``): a new revision
n+1 that references revision n's immutable objects, made current by the same one
statement (``publish_release.release``: the lock, the checks, the pointer's
compare-and-set, the previous revision SUPERSEDED, the ``releases`` row, ``asset.ready``).
Its storage revision is n's, so the one playback token of n+1 opens n's renditions and the
new files alike, and its new files are written under that prefix first, each under a name
no other revision uses (``hls/text/<track>.vtt`` and ``.m3u8``, ``hls/master-r<n+1>.m3u8``):
nothing published is ever overwritten, and files of an attempt that lost its race are
orphans the garbage collector takes after its grace period.

Only a revision at rest gets a track: none of its outputs still rendering (their
enrichment would find the pointer moved) and no rebuild under way; else the caller is told
to retry. A race with another track (two clients at once) is lost by one statement's
pointer check and tried again from the new current revision, so neither track is lost.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from aivedio.config.ledger import LedgerConfig
from aivedio.errors import TransientError
from aivedio.logs import get_logger
from aivedio.pipeline.media import text_tracks, webvtt
from aivedio.pipeline.media.text_tracks import Kind, Origin, TextTrack
from aivedio.pipeline.publish_release import NotPublishable, PointerMoved, Unmet, release
from aivedio.store import publishing, track_revisions
from aivedio.store.database import Pool
from aivedio.store.objects.base import ObjectStore
from aivedio.store.objects.keys import revision_prefix

log = get_logger("aivedio.publish")

ATTEMPTS = 3
MASTER_MAX_BYTES = 1024 * 1024
PLAYLIST_MIME = "application/vnd.apple.mpegurl"
SERVABLE = ("PLAYABLE", "ENRICHED")


class TrackNotAdded(Exception):
    """The track cannot be added now: ``reason`` is a stable code, ``retry_after_seconds``
    set when waiting will help (outputs still rendering, a rebuild under way)."""

    def __init__(self, reason: str, detail: str, retry_after_seconds: int | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.retry_after_seconds = retry_after_seconds


@dataclass(frozen=True, slots=True)
class NewTrack:
    kind: Kind
    language: str
    label: str
    default: bool
    origin: Origin
    captions: webvtt.Track


@dataclass(frozen=True, slots=True)
class Added:
    revision: int
    track: TextTrack
    tracks: list[TextTrack]


async def add_track(
    pool: Pool,
    store: ObjectStore,
    ledger: LedgerConfig,
    tenant_id: int,
    asset_id: uuid.UUID,
    new: NewTrack,
) -> Added:
    """Publish the current revision again with ``new`` added; raises ``TrackNotAdded``."""
    track_id = uuid.uuid4().hex[:16]
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await _attempt(pool, store, ledger, tenant_id, asset_id, new, track_id)
        except (PointerMoved, TransientError) as exc:
            # Another revision was published (or took the number) meanwhile: again from it.
            log.info(
                "track_revision_retried",
                asset_id=str(asset_id),
                attempt=attempt,
                detail=str(exc)[:200],
            )
    raise TrackNotAdded(
        "revision_busy", "the video kept changing while the track was added; retry", 1
    )


async def _attempt(
    pool: Pool,
    store: ObjectStore,
    ledger: LedgerConfig,
    tenant_id: int,
    asset_id: uuid.UUID,
    new: NewTrack,
    track_id: str,
) -> Added:
    row = await track_revisions.base(pool, tenant_id, asset_id)
    if row is None or row["status"] == "DELETED":
        raise TrackNotAdded("not_found", "no such video")
    if row["status"] not in SERVABLE or row["revision_status"] != "READY":
        raise TrackNotAdded("not_published", f"the video is not published ({row['status']})")
    if row["pending"] or row["building"]:
        raise TrackNotAdded(
            "revision_busy", "the video's outputs are still being made; retry later", 10
        )
    if row["hls_key"] is None:
        raise TrackNotAdded("no_hls", "the published revision has no HLS output to carry tracks")
    base_no = int(row["current_revision"])
    storage = int(row["storage_revision"])
    new_no = int(row["max_revision"]) + 1
    prefix = revision_prefix(tenant_id, asset_id, storage)
    extra: dict[str, Any] = dict(row["hls_extra"] or {})
    track = text_tracks.make_track(
        track_id,
        kind=new.kind,
        language=new.language,
        label=new.label,
        default=new.default,
        origin=new.origin,
        cues=len(new.captions.cues),
    )
    tracks = text_tracks.with_track(text_tracks.decode_tracks(extra), track)
    master_old = await store.get_bytes(row["hls_key"], max_bytes=MASTER_MAX_BYTES)
    master_path = f"hls/master-r{new_no}.m3u8"
    duration = (row["duration_us"] or 0) / 1e6
    files = {
        track.vtt: new.captions.webvtt().encode(),
        track.playlist: text_tracks.subtitle_playlist(track, duration).encode(),
        master_path: _master(master_old, tracks),
    }
    written = [await _put(store, f"{prefix}/{path}", path, body) for path, body in files.items()]
    old_master = row["hls_key"].removeprefix(prefix + "/")
    kept = [f for f in extra.get("files") or [] if f.get("path") != old_master]
    extra["files"] = [written[-1], *kept, *written[:-1]]
    extra["total_bytes"] = sum(int(f.get("size") or 0) for f in extra["files"])
    extra["tracks"] = [msgspec.to_builtins(t) for t in tracks]
    hls = {
        "object_key": f"{prefix}/{master_path}",
        "size_bytes": written[-1]["size"],
        "sha256": written[-1]["sha256"],
        "width": row["hls_width"],
        "height": row["hls_height"],
        "bitrate": row["hls_bitrate"],
        "codec": row["hls_codec"],
        "extra": extra,
    }
    outputs = sorted(row["published_outputs"] or [])
    checks = {
        "current": publishing.current_check(base_no),
        "not_deleted": publishing.not_deleted_check(row["delete_version_at_start"]),
        "not_cancelled": publishing.not_cancelled_check(row["cancel_version_at_start"]),
        "no_rebuild": publishing.no_rebuild_check(asset_id, base_no),
    }
    copy = track_revisions.copy_parts(
        asset_id, new_no, base_no, storage, outputs, hls, datetime.now(UTC), after_part="no_rebuild"
    )
    try:
        await release(
            pool,
            ledger,
            None,
            row,
            checks,
            base_no,
            new_no,
            outputs,
            row["status"] == "ENRICHED",
            enriches=storage,
            copy=copy,
        )
    except Unmet as exc:
        if exc.code == publishing.NOT_CURRENT:
            raise PointerMoved("the current revision moved") from exc
        if exc.code == publishing.REBUILDING:
            raise TrackNotAdded(
                "revision_busy", "the video is being rebuilt; retry later", 10
            ) from exc
        raise TrackNotAdded("not_published", "the video was deleted or cancelled") from exc
    except NotPublishable as exc:
        raise TrackNotAdded("not_published", str(exc)) from exc
    log.info(
        "track_added",
        asset_id=str(asset_id),
        revision=new_no,
        base=base_no,
        track_id=track.id,
        language=track.language,
        kind=track.kind,
        origin=track.origin,
        cues=track.cues,
    )
    return Added(revision=new_no, track=track, tracks=tracks)


def _master(master: bytes, tracks: list[TextTrack]) -> bytes:
    """The published master playlist again, naming ``tracks``."""
    try:
        return text_tracks.master_with_tracks(master.decode(), tracks).encode()
    except (UnicodeDecodeError, ValueError) as exc:
        raise TrackNotAdded("no_hls", "the published master playlist names no variant") from exc


async def _put(store: ObjectStore, key: str, path: str, body: bytes) -> dict[str, Any]:
    """Write one new file and describe it as an output's ``extra.files`` entry."""
    mime = "text/vtt" if path.endswith(".vtt") else PLAYLIST_MIME
    await store.put_bytes(key, body, content_type=mime)
    return {
        "path": path,
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "mime": mime,
    }
