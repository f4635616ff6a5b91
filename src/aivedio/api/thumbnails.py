"""``GET /media/{token}/thumbnail.jpg`` (and ``.webp``) ``?time=&width=``: a still of the
published playback, on demand, as Mux's image API and Cloudflare's thumbnails give one.

``time`` is seconds into the video (default: its middle), inside the duration; ``width`` is
pixels (default: the playback's, at most ``[api] thumbnail_max_width``), never above the
playback's own width (nothing is upscaled), the height following the aspect. Both are
rounded (``TIME_STEP_SECONDS``, an even width) so that the stills a player asks for are a
bounded set per revision.

A still is rendered once: from the published playback MP4 (read back at its recorded size
and SHA-256), by one sandboxed ffmpeg seek, and kept as an object under the revision's
prefix (``thumbnails/t{ms}_w{width}.{ext}``), where the next request finds it. Published
revisions never change, so every answer is cacheable for the token's lifetime, with an
ETag. Rendering costs CPU, so it is bounded twice: a bucket per token
(``[api] thumbnail_rate_per_second``/``thumbnail_burst``: 429 with Retry-After) and at most
``THUMBNAIL_RENDERS`` renders at once per API process (the rest wait their turn).
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

import anyio
from aiohttp import web

from aivedio.api import schema
from aivedio.api.context import ApiContext, context
from aivedio.api.problems import ApiError
from aivedio.api.published import servable_prefix
from aivedio.api.token_buckets import Rate
from aivedio.api.tokens import Claims
from aivedio.errors import AivedioError
from aivedio.logs import get_logger
from aivedio.pipeline import media_objects
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.media.sniff import MP4, input_args
from aivedio.store import asset_reads
from aivedio.store.playback_reads import published_variants

log = get_logger("aivedio.api")
routes = web.RouteTableDef()

TIME_STEP_SECONDS = 0.1
MIN_WIDTH = 16
THUMBNAIL_RENDERS = 2
FORMATS = {
    "jpg": ("image/jpeg", ["-q:v", "3"]),
    "webp": ("image/webp", ["-c:v", "libwebp", "-quality", "80"]),
}
_limiter = anyio.CapacityLimiter(THUMBNAIL_RENDERS)


def still_key(prefix: str, seconds: float, width: int, ext: str) -> str:
    return f"{prefix}thumbnails/t{round(seconds * 1000):08d}_w{width}.{ext}"


def chosen(
    request: web.Request, duration: float, source_width: int, max_width: int
) -> tuple[float, int]:
    """(time, width) from the query, checked and rounded."""
    raw_time = request.query.get("time")
    try:
        seconds = duration / 2 if raw_time is None else float(raw_time)
    except ValueError:
        raise ApiError(400, "time: seconds into the video", field="time") from None
    if not (math.isfinite(seconds) and 0 <= seconds <= duration):
        raise ApiError(400, f"time: from 0 to the duration, {duration:.3f}", field="time")
    # The last step may fall past the last frame: stay a step inside the end.
    seconds = min(
        round(seconds / TIME_STEP_SECONDS) * TIME_STEP_SECONDS,
        max(duration - TIME_STEP_SECONDS, 0.0),
    )
    ceiling = min(source_width, max_width)
    raw_width = request.query.get("width")
    if raw_width is None:
        return seconds, ceiling - ceiling % 2
    if not raw_width.isdigit() or not MIN_WIDTH <= int(raw_width) <= ceiling:
        raise ApiError(400, f"width: {MIN_WIDTH} to {ceiling} pixels", field="width")
    width = int(raw_width)
    return seconds, width - width % 2


async def render(
    ctx: ApiContext, claims: Claims, playback: Any, seconds: float, width: int, ext: str
) -> bytes:
    """One still from the playback MP4, in the sandbox."""
    sandbox = ctx.sandbox or Sandbox(ctx.config.media)
    ctx.sandbox = sandbox
    media = ctx.config.media
    async with _limiter:
        with sandbox.scratch() as scratch:
            source = scratch / "playback.mp4"
            await media_objects.download_piece(ctx.store, playback, source)
            out = scratch / f"still.{ext}"
            args = [
                "-ss",
                f"{seconds:.3f}",
                *input_args(
                    MP4, source, max_streams=media.max_streams, max_pixels=media.max_pixels
                ),
                "-map",
                "0:v:0",
                "-frames:v",
                "1",
                "-vf",
                f"scale={width}:-2",
                *FORMATS[ext][1],
                "-f",
                "image2",
                str(out),
            ]
            result = await sandbox.run("ffmpeg", args, cwd=scratch, deadline_seconds=30.0)
            if not result.ok or not out.is_file():
                result.raise_if_exhausted()
                log.warning(
                    "thumbnail_failed",
                    asset_id=str(claims.asset_id),
                    revision=claims.revision,
                    detail=result.error_detail()[:300],
                )
                raise ApiError(503, "the still could not be made now; retry")
            return out.read_bytes()


@routes.get("/media/{token}/thumbnail.{ext:jpg|webp}")
async def thumbnail(request: web.Request) -> web.Response:
    ctx = context(request)
    token = request.match_info["token"]
    claims = ctx.signer.verify(token)
    api = ctx.config.api
    # By what the token grants, not its string: one grant has one bucket, however many
    # strings verify as it (an ECDSA signature has two valid forms).
    grant = (claims.tenant_id, claims.asset_id, claims.revision, claims.expires_at)
    verdict = ctx.thumbnail_buckets.take(
        grant,
        Rate(api.thumbnail_rate_per_second, api.thumbnail_burst),
        time.monotonic(),
    )
    if verdict.wait_seconds > 0:
        raise ApiError(
            429,
            "too many stills for this token; retry later",
            headers={"Retry-After": str(verdict.retry_after_seconds)},
        )
    prefix = await servable_prefix(ctx.pool, claims.tenant_id, claims.asset_id, claims.revision)
    variants = await published_variants(ctx.pool, claims.asset_id, claims.revision)
    playback = next((v for v in variants if v["variant_type"] == "playback"), None)
    if prefix is None or playback is None:
        raise ApiError(404, "no such object")
    asset = await asset_reads.tenant_asset(ctx.pool, claims.tenant_id, claims.asset_id)
    duration = (asset["duration_us"] or 0) / 1e6 if asset is not None else 0.0
    source_width = playback["width"] or (asset["width"] if asset is not None else None)
    if not source_width:
        raise ApiError(404, "no such object")
    seconds, width = chosen(request, duration, source_width, api.thumbnail_max_width)
    ext = request.match_info["ext"]
    key = still_key(prefix, seconds, width, ext)
    info = await ctx.store.head(key)
    if info is None:
        try:
            body = await render(ctx, claims, playback, seconds, width, ext)
        except AivedioError as exc:
            log.warning(
                "thumbnail_failed", asset_id=str(claims.asset_id), error_class=exc.error_class
            )
            raise ApiError(503, "the still could not be made now; retry") from None
        await ctx.store.put_bytes(key, body)
    else:
        body = b"".join([chunk async for chunk in ctx.store.get(key)])
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    remaining = max(0, int(claims.expires_at - time.time()))
    headers = {
        "Cache-Control": f"public, max-age={remaining}, immutable",
        "Access-Control-Allow-Origin": "*",
        "ETag": etag,
    }
    if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type=FORMATS[ext][0], headers=headers)


PATHS: dict[str, Any] = {
    "/media/{token}/thumbnail.{ext}": {
        "get": {
            "summary": "A still of the published playback, on demand",
            "description": "Rendered once per (time, width), then kept; 429 past the token's rate.",
            "operationId": "getThumbnail",
            "tags": ["playback"],
            "security": [],
            "parameters": [
                {"name": "token", "in": "path", "required": True, "schema": {"type": "string"}},
                {
                    "name": "ext",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": ["jpg", "webp"]},
                },
                {
                    "name": "time",
                    "in": "query",
                    "required": False,
                    "description": "seconds into the video (default: its middle)",
                    "schema": {"type": "number", "minimum": 0},
                },
                {
                    "name": "width",
                    "in": "query",
                    "required": False,
                    "description": "pixels (default: the playback's, capped); never upscaled",
                    "schema": {"type": "integer", "minimum": MIN_WIDTH},
                },
            ],
            "responses": schema.responses(
                {
                    "200": {
                        "description": "the still",
                        "content": {
                            "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
                            "image/webp": {"schema": {"type": "string", "format": "binary"}},
                        },
                    },
                    "304": {"description": "not modified (If-None-Match)"},
                },
                400,
                403,
                404,
                503,
            ),
        }
    }
}
SCHEMAS: tuple[type, ...] = ()
