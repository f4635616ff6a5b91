"""(being written)"""

from __future__ import annotations

from typing import Any

from aiohttp import web

routes = web.RouteTableDef()
PATHS: dict[str, Any] = {}
SCHEMAS: tuple[type, ...] = ()
