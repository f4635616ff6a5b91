"""``GET /.well-known/jwks.json``: the public keys that verify playback tokens.

An edge (a CDN worker in front of ``/media``) fetches this document, caches it, and verifies
each ``/media/{token}/…`` request's token itself (``api/tokens.py`` says what to check),
without a call to the API per request. Only ES256 and RS256 keys are listed, the signing key
first; an HS256 secret is never published, so with HS256 keys alone the set is empty and only
the API can verify. The document changes only with the configuration (a rotation adds a key
before it signs: ``config/playback_keys.py``), so it may be cached for a few minutes.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aivedio.api.context import context

routes = web.RouteTableDef()

# How long an edge may cache the key set: shorter than a rotation's first step takes.
MAX_AGE_SECONDS = 300


@routes.get("/.well-known/jwks.json")
async def jwks(request: web.Request) -> web.Response:
    return web.json_response(
        context(request).signer.jwks(),
        content_type="application/jwk-set+json",
        headers={"Cache-Control": f"public, max-age={MAX_AGE_SECONDS}"},
    )


_JWK = {
    "type": "object",
    "required": ["kty", "kid", "alg", "use"],
    "properties": {
        "kty": {"type": "string", "enum": ["EC", "RSA"]},
        "kid": {"type": "string"},
        "alg": {"type": "string", "enum": ["ES256", "RS256"]},
        "use": {"type": "string", "enum": ["sig"]},
        "crv": {"type": "string"},
        "x": {"type": "string"},
        "y": {"type": "string"},
        "n": {"type": "string"},
        "e": {"type": "string"},
    },
}
PATHS: dict[str, Any] = {
    "/.well-known/jwks.json": {
        "get": {
            "summary": "The public keys that verify playback tokens (JWKS)",
            "description": "ES256 and RS256 keys only, the signing key first; an edge "
            "verifies /media tokens with them.",
            "operationId": "getPlaybackKeys",
            "tags": ["playback"],
            "security": [],
            "responses": {
                "200": {
                    "description": "the key set",
                    "content": {
                        "application/jwk-set+json": {
                            "schema": {
                                "type": "object",
                                "required": ["keys"],
                                "properties": {"keys": {"type": "array", "items": _JWK}},
                            }
                        }
                    },
                }
            },
        }
    }
}
SCHEMAS: tuple[type, ...] = ()
