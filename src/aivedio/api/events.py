"""(being written)"""

from __future__ import annotations

from typing import Any

import anyio
from aiohttp import web
from anyio.abc import TaskStatus

from aivedio.api.context import ApiContext

routes = web.RouteTableDef()
PATHS: dict[str, Any] = {}
SCHEMAS: tuple[type, ...] = ()


async def run_listener(
    ctx: ApiContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    task_status.started()
    await anyio.sleep_forever()


async def close_streams(ctx: ApiContext) -> None:
    return None
