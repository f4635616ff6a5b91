"""The route modules the API serves, in the order the app adds their routes.

Each owns a ``routes`` table and the OpenAPI ``PATHS`` (and ``SCHEMAS``) that describe them.
``openapi.py`` builds its document from this list and ``app.py`` serves this list plus the
document's own route, so a route cannot be served without being described.
"""

from __future__ import annotations

from types import ModuleType

from aivedio.api import (
    assets,
    callbacks,
    events,
    generation_tasks,
    health,
    jwks,
    listings,
    media,
    playback,
    player,
    thumbnails,
    tracks,
    tus,
    video_upload,
    videos,
    webhooks,
)

ROUTE_MODULES: tuple[ModuleType, ...] = (
    health,
    callbacks,
    videos,
    tracks,
    video_upload,
    tus,
    generation_tasks,
    assets,
    events,
    thumbnails,
    media,
    playback,
    jwks,
    listings,
    webhooks,
    player,
)
