"""Path ids: a malformed id is simply not found, never a server error."""

from __future__ import annotations

import uuid

from aiohttp import web

from aivedio.api.problems import ApiError


def path_uuid(request: web.Request, name: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(request.match_info[name])
    except ValueError:
        raise ApiError(404, f"no such {what}") from None
