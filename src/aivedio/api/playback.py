"""``GET /v1/videos/{video_id}/playback``: playback URLs for the published revision.

Only the owner's tenant (another tenant gets the same 404 as a missing id) and only a
published revision: 409 ``not_published`` while it is still being made, and for an upload
whose session is not completed (open, failed or expired: the detail names the state), since
that video exists (``POST /v1/videos`` made it, its status answers) but has no asset yet.
The token is scoped to that revision's prefix: one token opens the master
playlist, every rendition and segment under it, the MP4, poster, sprites and waveform, and
nothing else.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
from aiohttp import web

from aivedio.api import schema
from aivedio.api.auth import tenant_of
from aivedio.api.context import ApiContext, context
from aivedio.api.ids import path_uuid
from aivedio.api.problems import ApiError
from aivedio.api.published import SERVABLE_STATES, published_files, servable_prefix
from aivedio.api.video_bodies import upload_state
from aivedio.store import asset_reads, uploads

routes = web.RouteTableDef()


class PlaybackTrack(msgspec.Struct, frozen=True, kw_only=True):
    """A caption or subtitle track: its WebVTT file (for a ``<track>`` element) and its
    subtitle media playlist (the master playlist's SUBTITLES group names it too)."""

    id: str
    kind: str
    language: str
    label: str
    default: bool
    url: str
    playlist: str


class Playback(msgspec.Struct, frozen=True, kw_only=True):
    video_id: str
    state: str
    revision: int
    token: str
    expires_at: datetime
    watch_url: str
    master_playlist: str | None = None
    mp4: str | None = None
    proxy: str | None = None
    poster: str | None = None
    thumbnails_vtt: str | None = None
    waveform: str | None = None
    keyframes: str | None = None
    tracks: list[PlaybackTrack] = []


# Playback field → the variant whose primary file it points at.
FIELDS = {
    "master_playlist": "hls",
    "mp4": "playback",
    "proxy": "proxy",
    "poster": "poster",
    "thumbnails_vtt": "sprite",
    "waveform": "waveform",
    "keyframes": "keyframes",
}


async def issue(ctx: ApiContext, tenant_id: int, video: Any) -> Playback:
    row = await asset_reads.tenant_asset_state(ctx.pool, tenant_id, video)
    if row is None:
        session = await uploads.load_session(ctx.pool, tenant_id, video)
        if session is not None and session.status != uploads.COMPLETED:
            state = upload_state(session)
            raise ApiError(409, f"the video is not published (state {state})", "not_published")
    if row is None or row["status"] == "DELETED":
        raise ApiError(404, "no such video")
    if row["status"] not in SERVABLE_STATES or row["current_revision"] is None:
        raise ApiError(409, f"the video is not published (state {row['status']})", "not_published")
    revision = int(row["current_revision"])
    files = await published_files(ctx.pool, tenant_id, video, revision)
    storage = await servable_prefix(ctx.pool, tenant_id, video, revision)
    token, claims = ctx.signer.issue(
        tenant_id,
        video,
        revision,
        ctx.config.api.playback_token_ttl_seconds,
        storage_prefix=storage,
    )
    base = ctx.base_url()
    media = f"{base}/media/{token}/"
    urls = {name: media + files[v]["path"] for name, v in FIELDS.items() if v in files}
    tracks = [
        PlaybackTrack(
            id=t.id,
            kind=t.kind,
            language=t.language,
            label=t.label,
            default=t.default,
            url=media + t.vtt,
            playlist=media + t.playlist,
        )
        for t in files.get("hls", {}).get("tracks") or []
    ]
    return Playback(
        video_id=str(video),
        state=row["status"],
        revision=revision,
        token=token,
        expires_at=datetime.fromtimestamp(claims.expires_at, UTC),
        watch_url=f"{base}/watch/{video}?token={token}",
        tracks=tracks,
        **urls,
    )


@routes.get("/v1/videos/{video_id}/playback")
async def playback(request: web.Request) -> web.Response:
    video = path_uuid(request, "video_id", "video")
    return schema.encode(await issue(context(request), tenant_of(request), video))


_LINKS = {
    "watchVideo": schema.link(
        "watchVideo",
        "the player page the token opens",
        {"asset_id": "$response.body#/video_id", "token": "$response.body#/token"},
    )
}
PATHS: dict[str, Any] = {
    "/v1/videos/{video_id}/playback": {
        "get": {
            "summary": "Playback URLs of the published revision",
            "description": "A token scoped to the revision's prefix opens every URL returned.",
            "operationId": "getVideoPlayback",
            "tags": ["videos"],
            "parameters": [schema.path_param("video_id", "the video (asset) id")],
            "responses": schema.responses(
                {"200": {**schema.ok_json(Playback), "links": _LINKS}}, 404, 503
            )
            | {
                "409": {
                    "description": "not published: still being made, refused, or an upload "
                    "not completed (the state is in the detail)",
                    "content": schema.json_content(schema.Error),
                }
            },
        }
    }
}
SCHEMAS: tuple[type, ...] = (Playback, PlaybackTrack)
