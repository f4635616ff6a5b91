"""The player page ``GET /watch/{asset_id}?token=…`` and its static files ``/static/{name}``.

The page plays one published revision with the token it was given: the token is checked like
the gateway checks it (``tokens.py``; 403 when malformed, tampered with, expired or issued for
another asset), the revision must still be servable (``published.py``; 404 otherwise), and
every media URL on the page is ``/media/{token}/{path}`` under that revision, so the gateway
decides each request again (a deleted asset stops playing at once).

The page is ``static/watch.html`` filled by ``string.Template`` with escaped values; the
settings reach ``static/watch.js`` as a JSON block (``<script type="application/json">``),
so the Content-Security-Policy allows no inline script and nothing but this origin (plus
``blob:`` for Media Source playback). Framing is not restricted: the page is the embeddable
player. Playback: hls.js where Media Source Extensions exist,
native HLS where the browser has it, the progressive MP4 otherwise.

hls.js is vendored from the npm registry at a pinned version and integrity by
``ensure_web_assets`` (``scripts/lib/bootstrap.sh``) into ``static/vendor/`` (not in git).
When it is missing the page still renders, says so, and plays without it; the API logs a
warning naming the script that installs it.

Static files are served only from a fixed list. The page links them with ``?v=`` and the
first 16 hex digits of their SHA-256, so a response to a matching ``v`` is cacheable for a
year (``immutable``); any other request gets a short cache.
"""

from __future__ import annotations

import hashlib
import html
import string
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
import msgspec
from aiohttp import web

from aivedio.api import schema
from aivedio.api.context import ApiContext, context
from aivedio.api.ids import path_uuid
from aivedio.api.problems import ApiError
from aivedio.api.published import is_servable, published_files
from aivedio.logs import get_logger
from aivedio.pipeline.media.credentials import ContentCredentials, content_credentials
from aivedio.pipeline.media.text_tracks import TextTrack
from aivedio.store import asset_reads

log = get_logger("aivedio.api")

routes = web.RouteTableDef()

STATIC_DIR = Path(__file__).with_name("static")
VENDOR_DIR = STATIC_DIR / "vendor"
HLS_JS = VENDOR_DIR / "hls.min.js"
HLS_WORKER = VENDOR_DIR / "hls.worker.js"
HLS_LICENSE = VENDOR_DIR / "hls.js-LICENSE.txt"
WATCH_TEMPLATE = STATIC_DIR / "watch.html"
INSTALL_HINT = (
    "scripts/test and scripts/demo install it (ensure_web_assets in scripts/lib/bootstrap.sh)"
)

JS = "text/javascript; charset=utf-8"
LONG_CACHE = "public, max-age=31536000, immutable"
SHORT_CACHE = "public, max-age=300"
VERSION_DIGITS = 16

# Published variant → the page setting naming its primary file.
MEDIA_FIELDS = {
    "hls": "hls",
    "playback": "mp4",
    "poster": "poster",
    "sprite": "thumbnails_vtt",
    "waveform": "waveform",
}


def static_files() -> dict[str, tuple[Path, str]]:
    """Every name ``/static/{name}`` serves: its file and content type (read at call time,
    so a test can point the vendored paths elsewhere)."""
    return {
        "watch.js": (STATIC_DIR / "watch.js", JS),
        "watch.css": (STATIC_DIR / "watch.css", "text/css; charset=utf-8"),
        "hls.min.js": (HLS_JS, JS),
        "hls.worker.js": (HLS_WORKER, JS),
        "hls.js-LICENSE.txt": (HLS_LICENSE, "text/plain; charset=utf-8"),
    }


@dataclass(frozen=True)
class _Static:
    stamp: tuple[int, int]  # (mtime_ns, size) of the file read
    body: bytes
    digest: str

    @property
    def version(self) -> str:
        return self.digest[:VERSION_DIGITS]


_STATIC_CACHE: dict[Path, _Static] = {}
_warned_missing: set[Path] = set()


def _read(path: Path) -> _Static | None:
    try:
        st = path.stat()
    except OSError:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _STATIC_CACHE.get(path)
    if cached is not None and cached.stamp == stamp:
        return cached
    try:
        body = path.read_bytes()
    except OSError:
        return None
    entry = _Static(stamp, body, hashlib.sha256(body).hexdigest())
    _STATIC_CACHE[path] = entry
    return entry


async def load_static(path: Path) -> _Static | None:
    """The file's bytes and digest (read again only when it changed); None when missing."""
    return await anyio.to_thread.run_sync(_read, path)


async def static_url(name: str) -> str | None:
    """``/static/{name}?v={digest}``, or None when the file is missing."""
    path, _ = static_files()[name]
    entry = await load_static(path)
    return None if entry is None else f"/static/{name}?v={entry.version}"


@routes.get("/static/{name}")
async def static(request: web.Request) -> web.Response:
    known = static_files().get(request.match_info["name"])
    entry = await load_static(known[0]) if known else None
    if known is None or entry is None:
        raise ApiError(404, "no such static file")
    etag = f'"{entry.version}"'
    headers = {
        "Cache-Control": LONG_CACHE if request.query.get("v") == entry.version else SHORT_CACHE,
        "ETag": etag,
        "X-Content-Type-Options": "nosniff",
    }
    if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
        return web.Response(status=304, headers=headers)
    return web.Response(body=entry.body, headers={**headers, "Content-Type": known[1]})


def _csp(ctx: ApiContext) -> str:
    media = "'self' blob:"
    img = "'self'"
    connect = "'self'"
    if ctx.config.api.media_redirect and hasattr(ctx.store, "presign_get"):
        # The gateway answers with redirects to the object store: allow its origin.
        parts = urlsplit(ctx.config.storage.s3_endpoint_url)
        origin = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else "https:"
        media, img, connect = f"{media} {origin}", f"{img} {origin}", f"{connect} {origin}"
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            f"img-src {img}",
            f"media-src {media}",
            f"connect-src {connect}",
            "worker-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
        ]
    )


def _json_for_html(value: Any) -> str:
    """JSON that cannot end the ``<script>`` element it is written into."""
    text = msgspec.json.encode(value).decode()
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _hls_js_missing(path: Path) -> None:
    if path not in _warned_missing:
        _warned_missing.add(path)
        log.warning("hls_js_missing", path=str(path), hint=INSTALL_HINT)


_STATE_TEXT = {
    "trusted": "verified, trusted signer",
    "valid": "verified",
    "untrusted": "verified, signer not on the trust list",
    "invalid": "failed verification",
}


def credentials_html(found: ContentCredentials | None) -> str:
    """The "Content Credentials" badge: a disclosure with what the C2PA manifests say
    (every value from a manifest escaped: a source's manifest is untrusted text)."""
    if found is None:
        return ""
    rows: list[tuple[str, str]] = []
    if found.ai_generated is not None:
        kind = found.source.digital_source_type if found.source else None
        rows.append(("AI-generated", ("yes" if found.ai_generated else "no") + f" ({kind})"))
    source = found.source
    if source is not None and source.present:
        signer = source.signer_subject or "unknown"
        if source.signer_issuer:
            signer += f" (issued by {source.signer_issuer})"
        rows.append(("Source signed by", signer))
        rows.append(("Source manifest", _STATE_TEXT.get(source.state, source.state)))
        if source.claim_generator:
            rows.append(("Made with", source.claim_generator))
    elif source is not None:
        rows.append(("Source manifest", "none"))
    if found.platform_signed and found.platform_signer:
        rows.append(("Published files signed by", found.platform_signer))
    elif found.outputs:
        rows.append(("Published files", "not all signed"))
    items = "".join(
        f"<dt>{html.escape(name)}</dt><dd>{html.escape(value)}</dd>" for name, value in rows
    )
    mark = " ai" if found.ai_generated else ""
    return (
        f'<details class="credentials{mark}" id="player-credentials">'
        '<summary><span class="cr-mark" aria-hidden="true">cr</span> Content Credentials'
        f"</summary><dl>{items}</dl></details>"
    )


def tracks_html(media: str, files: dict[str, dict[str, Any]]) -> str:
    """A ``<track>`` per text track of the revision (every value escaped; the default one
    marked ``default``, so the browser shows it)."""
    tracks: list[TextTrack] = files.get("hls", {}).get("tracks") or []
    return "".join(
        f'<track kind="{html.escape(t.kind)}" srclang="{html.escape(t.language)}"'
        f' label="{html.escape(t.label)}" src="{html.escape(media + quote(t.vtt))}"'
        + (" default" if t.default else "")
        + ">"
        for t in tracks
    )


async def render_page(
    asset_id: uuid.UUID,
    revision: int,
    token: str,
    files: dict[str, dict[str, Any]],
    credentials: ContentCredentials | None = None,
) -> str:
    media = f"/media/{quote(token, safe='')}/"
    settings: dict[str, Any] = {"asset_id": str(asset_id), "revision": revision}
    for variant, name in MEDIA_FIELDS.items():
        settings[name] = media + quote(files[variant]["path"]) if variant in files else None
    hls_js = await static_url("hls.min.js")
    settings["hls_js"] = hls_js is not None
    settings["hls_worker"] = await static_url("hls.worker.js")
    if hls_js is None:
        _hls_js_missing(HLS_JS)
    else:
        _warned_missing.discard(HLS_JS)
    scripts = [url for url in (hls_js, await static_url("watch.js")) if url is not None]
    notice = (
        ""
        if hls_js is not None
        else '<p class="notice" id="player-notice">The hls.js player library is not installed'
        f" on this server ({html.escape(INSTALL_HINT)}); playing without it.</p>"
    )
    poster = settings["poster"]
    stylesheet = await static_url("watch.css") or "/static/watch.css"
    template = await load_static(WATCH_TEMPLATE)
    if template is None:
        raise FileNotFoundError(f"the player page template is missing: {WATCH_TEMPLATE}")
    return string.Template(template.body.decode()).substitute(
        title=html.escape(f"Video {asset_id}"),
        stylesheet=html.escape(stylesheet),
        scripts="\n".join(f'<script src="{html.escape(u)}" defer></script>' for u in scripts),
        settings=_json_for_html(settings),
        poster=f' poster="{html.escape(poster)}"' if poster else "",
        tracks=tracks_html(media, files),
        notice=notice,
        credentials=credentials_html(credentials),
    )


@routes.get("/watch/{asset_id}")
async def watch(request: web.Request) -> web.Response:
    ctx = context(request)
    asset_id = path_uuid(request, "asset_id", "video")
    token = request.query.get("token", "")
    if not token:
        raise ApiError(403, "a playback token is required: /watch/{asset_id}?token=…")
    if not token.isascii():  # TokenSigner.verify compares str MACs: ASCII only
        raise ApiError(403, "playback token is malformed")
    claims = ctx.signer.verify(token)
    if claims.asset_id != asset_id:
        raise ApiError(403, "the playback token is for another video")
    if not await is_servable(ctx.pool, claims.tenant_id, claims.asset_id, claims.revision):
        raise ApiError(404, "no such video")
    files = await published_files(ctx.pool, claims.tenant_id, claims.asset_id, claims.revision)
    row = await asset_reads.tenant_asset(ctx.pool, claims.tenant_id, claims.asset_id)
    credentials = content_credentials(
        row["provenance"] if row is not None else None,
        {name: f["c2pa"] for name, f in files.items()},
    )
    page = await render_page(asset_id, claims.revision, token, files, credentials)
    return web.Response(
        text=page,
        content_type="text/html",
        charset="utf-8",
        headers={
            "Content-Security-Policy": _csp(ctx),
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )


PATHS: dict[str, Any] = {
    "/watch/{asset_id}": {
        "get": {
            "summary": "The player page of a published video",
            "description": "An HTML page playing the revision the token opens (HLS with "
            "hls.js or natively, else the MP4), with its caption tracks, sprite thumbnails, the "
            "waveform and a "
            "Content Credentials badge (the C2PA provenance of the video).",
            "operationId": "watchVideo",
            "tags": ["playback"],
            "security": [],
            "parameters": [
                schema.path_param("asset_id", "the video (asset) id"),
                {
                    "name": "token",
                    "in": "query",
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "playback token from GET /v1/videos/{video_id}/playback",
                },
            ],
            "responses": schema.responses(
                {
                    "200": {
                        "description": "the player page",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
                403,
                404,
                503,
            ),
        }
    },
    "/static/{name}": {
        "get": {
            "summary": "A static file of the player page",
            "description": "watch.js, watch.css and the vendored hls.js files.",
            "operationId": "getStatic",
            "tags": ["playback"],
            "security": [],
            "parameters": [
                {
                    "name": "name",
                    "in": "path",
                    "required": True,
                    "description": "the file name",
                    "schema": {
                        "type": "string",
                        "enum": [
                            "watch.js",
                            "watch.css",
                            "hls.min.js",
                            "hls.worker.js",
                            "hls.js-LICENSE.txt",
                        ],
                    },
                },
                {
                    "name": "v",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "the content version the page links (cacheable for a year)",
                },
            ],
            "responses": schema.responses(
                {
                    "200": {
                        "description": "the file",
                        "content": {
                            "text/javascript": {"schema": {"type": "string"}},
                            "text/css": {"schema": {"type": "string"}},
                            "text/plain": {"schema": {"type": "string"}},
                        },
                    },
                    "304": {"description": "not modified (If-None-Match)"},
                },
                404,
            ),
        }
    },
}
SCHEMAS: tuple[type, ...] = ()
