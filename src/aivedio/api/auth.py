"""Who may call ``/v1``: every route but provider callbacks needs a credential, and every
query is scoped by its tenant (``tenant_of``). A credential in a query string is refused:
URLs end up in logs, proxies and browser history.

Two credentials, one rule each:

* **An API key** (``av_live_…``) opens everything of its tenant.
* **A one-time upload token** (``avu_…``, from ``POST /v1/videos`` with ``"resumable":
  true``) opens one resumable upload and nothing else: only the tus routes
  (``/v1/uploads``), only its own upload there (``granted_upload``; a handler answers 404
  for any other, like a missing one), and only while that upload awaits its bytes. So a
  browser can send a file without ever holding the API key.

``OPTIONS`` on the tus routes needs no credential: it is tus's discovery of what the server
supports, and a browser's CORS preflight, which carries none.
"""

from __future__ import annotations

import uuid

from aiohttp import web

from aivedio.api.context import context
from aivedio.api.problems import Handler, problem
from aivedio.store.api_keys import key_prefix, tenant_for_key
from aivedio.store.resumable_uploads import is_upload_token, session_for_token

TENANT = web.RequestKey("aivedio_tenant_id", int)
# The verified key's public prefix: its rate limit bucket (``rate_limits.py``).
API_KEY = web.RequestKey("aivedio_api_key_prefix", str)
# The one upload an upload token opens (absent for an API key).
UPLOAD_GRANT = web.RequestKey("aivedio_upload_grant", uuid.UUID)
PUBLIC_V1_PREFIXES = ("/v1/providers/",)
UPLOADS_PATH = "/v1/uploads"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="aivedio"'}


def needs_key(path: str) -> bool:
    return path.startswith("/v1/") and not path.startswith(PUBLIC_V1_PREFIXES)


def is_upload_route(path: str) -> bool:
    return path == UPLOADS_PATH or path.startswith(UPLOADS_PATH + "/")


def tenant_of(request: web.Request) -> int:
    return request[TENANT]


def granted_upload(request: web.Request) -> uuid.UUID | None:
    """The one upload the request's upload token opens; None for an API key."""
    return request.get(UPLOAD_GRANT)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not needs_key(request.path):
        return await handler(request)
    if request.method == "OPTIONS" and is_upload_route(request.path):
        return await handler(request)
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return problem(401, "an API key is required: Authorization: Bearer av_…", headers=CHALLENGE)
    if is_upload_token(key):
        return await _with_upload_token(request, handler, key)
    tenant = await tenant_for_key(context(request).pool, key)
    if tenant is None:
        return problem(401, "the API key is unknown or revoked", headers=CHALLENGE)
    request[TENANT] = tenant
    request[API_KEY] = key_prefix(key) or ""
    return await handler(request)


async def _with_upload_token(
    request: web.Request, handler: Handler, token: str
) -> web.StreamResponse:
    if not is_upload_route(request.path):
        return problem(
            401,
            "an upload token opens its upload only (/v1/uploads): use an API key here",
            headers=CHALLENGE,
        )
    session = await session_for_token(context(request).pool, token)
    if session is None:
        return problem(
            401,
            "the upload token is unknown, or its upload has ended",
            headers=CHALLENGE,
        )
    request[TENANT] = session.tenant_id
    request[UPLOAD_GRANT] = session.id
    request[API_KEY] = f"upload:{session.id}"  # its own rate limit bucket
    return await handler(request)
