"""The API process: the aiohttp application and the server that runs it.

Route modules each own a ``routes`` table and the OpenAPI ``PATHS`` that describe them
(``route_modules.py`` lists them; ``openapi.py`` assembles the document from that same list,
so a route cannot be served without being described). ``run_app`` is the one way the app is
served, by ``aivedio api`` and by the tests alike: the events listener runs beside the HTTP
site in one task group, and SIGTERM (``ctx.draining``) turns /readyz to 503, lets in-flight
requests finish and ends open event streams.
"""

from __future__ import annotations

from types import ModuleType

import anyio
from aiohttp import web
from anyio.abc import TaskStatus

from aivedio.api import events, openapi, rate_limits
from aivedio.api.auth import auth_middleware
from aivedio.api.context import CONTEXT, ApiContext
from aivedio.api.problems import Handler, error_middleware
from aivedio.api.route_modules import ROUTE_MODULES
from aivedio.config.api import listen_base_url, require_public_base_url
from aivedio.http_server import make_runner
from aivedio.logs import get_logger

log = get_logger("aivedio.api")

# The described routes, then the document that describes them.
SERVED_MODULES: tuple[ModuleType, ...] = (*ROUTE_MODULES, openapi)
SHUTDOWN_SECONDS = 10.0


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    request.app[CONTEXT].metrics.requests.labels(route, str(response.status)).inc()
    return response


def make_app(ctx: ApiContext) -> web.Application:
    # Rate limits around the key check: per address before it, per key after it.
    before_auth, after_auth = rate_limits.middlewares(
        ctx.config.api.rate_limits, ctx.metrics, frozenset(ctx.config.providers)
    )
    # The largest body any route reads whole; uploads stream and set their own limit.
    app = web.Application(
        middlewares=[
            metrics_middleware,
            error_middleware,
            *before_auth,
            auth_middleware,
            *after_auth,
        ],
        client_max_size=max(ctx.config.api.max_callback_bytes, 1024 * 1024),
    )
    app[CONTEXT] = ctx
    for module in SERVED_MODULES:
        app.router.add_routes(module.routes)
    return app


async def run_app(
    ctx: ApiContext,
    host: str,
    port: int,
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; ``task_status`` reports the bound port."""
    require_public_base_url(ctx.config.api, host)  # the host served may not be [api] host
    app = make_app(ctx)
    runner = make_runner(app, shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(events.run_listener, ctx)
            site = web.TCPSite(runner, host, port)
            await site.start()
            bound = runner.addresses[0][1] if runner.addresses else port
            ctx.listen_base_url = listen_base_url(host, bound)
            log.info("api_listening", host=host, port=bound)
            task_status.started(bound)
            await anyio.sleep_forever()
    finally:
        ctx.draining = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_SECONDS + 5):
            await events.close_streams(ctx)
            await runner.cleanup()
