"""API keys on ``/v1``: every route but provider callbacks needs one, and every query is
scoped by the key's tenant (``tenant_of``). A key in a query string is refused: URLs end up
in logs, proxies and browser history."""

from __future__ import annotations

from aiohttp import web

from aivedio.api.context import context
from aivedio.api.problems import Handler, problem
from aivedio.store.api_keys import key_prefix, tenant_for_key

TENANT = web.RequestKey("aivedio_tenant_id", int)
# The verified key's public prefix: its rate limit bucket (``rate_limits.py``).
API_KEY = web.RequestKey("aivedio_api_key_prefix", str)
PUBLIC_V1_PREFIXES = ("/v1/providers/",)
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="aivedio"'}


def needs_key(path: str) -> bool:
    return path.startswith("/v1/") and not path.startswith(PUBLIC_V1_PREFIXES)


def tenant_of(request: web.Request) -> int:
    return request[TENANT]


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not needs_key(request.path):
        return await handler(request)
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return problem(401, "an API key is required: Authorization: Bearer av_…", headers=CHALLENGE)
    tenant = await tenant_for_key(context(request).pool, key.strip())
    if tenant is None:
        return problem(401, "the API key is unknown or revoked", headers=CHALLENGE)
    request[TENANT] = tenant
    request[API_KEY] = key_prefix(key.strip()) or ""
    return await handler(request)
