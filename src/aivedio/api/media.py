"""The playback gateway: ``GET /media/{token}/{path}`` serves one published revision.

The token (``tokens.py``) names a tenant, an asset and a revision; the path is read only
under that revision's prefix, so a token for one revision or asset cannot open another's
objects, and keys are never taken from the client beyond that relative path (validated like
every key). Each request also checks that the asset is still live and the revision was
released (``published.py``): a deleted asset stops playing at once.

HTTP details a player and a CDN rely on: single byte ranges (``206``, ``416`` with
``Content-Range: bytes */size``), ``HEAD``, ``ETag``/``If-None-Match``, content types from
the one MIME table (``pipeline/ffmpeg/outputs.py``), and caching that never outlives the
token: published objects are immutable, so they are cacheable with ``immutable`` for the
token's remaining lifetime (URLs are revision- and token-scoped, so nothing stale can be
served). With ``[api] media_redirect`` and an S3 store, the answer is a redirect to a
short-lived presigned URL instead of the bytes.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import PurePosixPath
from typing import Any

from aiohttp import web

from aivedio.api import schema
from aivedio.api.context import context
from aivedio.api.problems import ApiError
from aivedio.api.published import servable_prefix
from aivedio.pipeline.ffmpeg.outputs import MIME
from aivedio.store.objects.base import InvalidKeyError, PresigningStore, validate_key

routes = web.RouteTableDef()

EXTRA_MIME = {".ts": "video/mp2t", ".m4a": "audio/mp4", ".dat": "application/octet-stream"}
# Playlists are tiny and read first; everything else is media bytes.
SHORT_CACHE_SUFFIXES = frozenset({".m3u8", ".vtt", ".json"})
SHORT_CACHE_SECONDS = 60
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def content_type(path: str) -> str:
    suffix = PurePosixPath(path).suffix.lower()
    return MIME.get(suffix) or EXTRA_MIME.get(suffix) or "application/octet-stream"


def cache_control(path: str, expires_at: int, now: float) -> str:
    remaining = max(0, int(expires_at - now))
    if PurePosixPath(path).suffix.lower() in SHORT_CACHE_SUFFIXES:
        return f"public, max-age={min(remaining, SHORT_CACHE_SECONDS)}"
    return f"public, max-age={remaining}, immutable"


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single satisfiable range; None for the whole object.

    Raises ``ApiError(416)`` when the range cannot be satisfied. Several ranges, or a
    syntax we do not serve, mean the whole object (RFC 9110 lets a server ignore Range)."""
    if not header:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last N bytes
        length = int(last)
        if length == 0 or size == 0:
            raise ApiError(416, "range not satisfiable")
        return max(0, size - length), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or (last and int(last) < start):
        raise ApiError(416, "range not satisfiable")
    return start, end


async def _serve(request: web.Request) -> web.StreamResponse:
    ctx = context(request)
    claims = ctx.signer.verify(request.match_info["token"])
    path = request.match_info["path"]
    try:
        validate_key(claims.prefix + path)
    except InvalidKeyError:
        raise ApiError(404, "no such object") from None
    # The revision's files live under its storage revision's prefix (published.py).
    prefix = await servable_prefix(ctx.pool, claims.tenant_id, claims.asset_id, claims.revision)
    if prefix is None:
        raise ApiError(404, "no such object")
    key = validate_key(prefix + path)
    info = await ctx.store.head(key)
    if info is None:
        raise ApiError(404, "no such object")
    now = time.time()
    headers = {
        "Cache-Control": cache_control(path, claims.expires_at, now),
        "Access-Control-Allow-Origin": "*",
        "Accept-Ranges": "bytes",
    }
    if ctx.config.api.media_redirect and isinstance(ctx.store, PresigningStore):
        ttl = min(ctx.config.api.presign_ttl_seconds, max(1.0, claims.expires_at - now))
        # The object store answers Range itself; the type is the one this gateway would send.
        url = await ctx.store.presign_get(
            key, expires_seconds=math.ceil(ttl), content_type=content_type(path)
        )
        raise web.HTTPFound(
            url, headers={"Cache-Control": "no-store", "Access-Control-Allow-Origin": "*"}
        )
    etag = f'"{info.etag}"' if info.etag and not info.etag.startswith('"') else info.etag
    if etag:
        headers["ETag"] = etag
        if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
            return web.Response(status=304, headers=headers)
    try:
        wanted = parse_range(request.headers.get("Range"), info.size)
    except ApiError:
        return web.Response(
            status=416, headers={**headers, "Content-Range": f"bytes */{info.size}"}
        )
    start, end = wanted if wanted is not None else (0, info.size - 1)
    response = web.StreamResponse(status=206 if wanted else 200, headers=headers)
    response.content_type = content_type(path)
    response.content_length = max(0, end - start + 1)
    if wanted:
        response.headers["Content-Range"] = f"bytes {start}-{end}/{info.size}"
    await response.prepare(request)
    if request.method == "HEAD" or info.size == 0:
        await response.write_eof()
        return response
    chunks = ctx.store.get(key, start=start, end=end)
    try:
        async for chunk in chunks:
            await response.write(chunk)
            ctx.metrics.media_bytes.inc(len(chunk))
    finally:
        # A client that goes away mid-body must not keep a file or connection open.
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
    await response.write_eof()
    return response


@routes.get("/media/{token}/{path:.+}", allow_head=True)
async def media(request: web.Request) -> web.StreamResponse:
    return await _serve(request)


def _media_paths() -> dict[str, Any]:
    params = [
        {
            "name": "token",
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
            "description": "a playback token from GET /v1/videos/{video_id}/playback",
        },
        {
            "name": "path",
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
            "description": "the object's path under the revision, e.g. hls/master.m3u8",
        },
        {"name": "Range", "in": "header", "required": False, "schema": {"type": "string"}},
    ]
    body = {
        "description": "the object's bytes",
        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
    }
    ok: dict[str, dict[str, Any]] = {
        "200": body,
        "206": {**body, "description": "the requested byte range"},
        "302": {"description": "redirect to a presigned object-store URL (media_redirect)"},
        "304": {"description": "not modified (If-None-Match)"},
        "416": {
            "description": "range not satisfiable",
            "headers": {
                "Content-Range": {
                    "required": True,
                    "description": "bytes */{size}: the object's size",
                    "schema": {"type": "string", "pattern": "^bytes \\*/[0-9]+$"},
                }
            },
        },
    }
    operation = {
        "tags": ["playback"],
        "security": [],
        "parameters": params,
        "responses": schema.responses(ok, 403, 404, 503),
    }
    return {
        "/media/{token}/{path}": {
            "get": {**operation, "summary": "Published media bytes", "operationId": "getMedia"},
            "head": {**operation, "summary": "Published media headers", "operationId": "headMedia"},
        }
    }


PATHS = _media_paths()
SCHEMAS: tuple[type, ...] = ()
