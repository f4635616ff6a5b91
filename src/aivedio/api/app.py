"""The API process: the aiohttp application and the server that runs it.

Route modules each own a ``routes`` table and the OpenAPI ``PATHS`` that describe them
(``route_modules.py`` lists them; ``openapi.py`` assembles the document from that same list,
so a route cannot be served without being described). ``run_app`` is the one way the app is
served, by ``aivedio api`` and by the tests alike: the events listener runs beside the HTTP
site in one task group.

Stopping behind a load balancer, as Kubernetes stops a pod: the balancer keeps sending
requests until its readiness probe has failed and the endpoint change has reached every
proxy, seconds after SIGTERM. A process that closes its listener at once refuses those
requests. So SIGTERM first sets ``ctx.draining`` (``aivedio api`` does, then waits
``[api] drain_delay_seconds``): /readyz answers 503 while every other route is served as
before, answers carrying ``Connection: close`` so keep-alive clients reconnect through the
balancer. Then ``run_app`` is cancelled: it closes the listener, ends event streams (clients
reconnect elsewhere with ``Last-Event-ID``) and gives requests in flight up to
``[api] drain_timeout_seconds`` to finish.
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
from aivedio.config.api import ApiConfig, listen_base_url, require_public_base_url
from aivedio.http_server import make_runner, stop_serving
from aivedio.logs import get_logger

log = get_logger("aivedio.api")

# The described routes, then the document that describes them.
SERVED_MODULES: tuple[ModuleType, ...] = (*ROUTE_MODULES, openapi)
# After [api] drain_timeout_seconds, how long requests still running get to end once cancelled.
CANCEL_WAIT_SECONDS = 1.0


@web.middleware
async def drain_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    if request.app[CONTEXT].draining:
        # A keep-alive connection would go on bringing requests here after the balancer has
        # taken this process out: close it after this answer (``Connection: close``).
        response.force_close()
    return response


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
            drain_middleware,
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
    """Serve until cancelled; ``task_status`` reports the bound port. Cancelled, stop
    accepting and let requests in flight finish, for up to ``drain_timeout_seconds``."""
    require_public_base_url(ctx.config.api, host)  # the host served may not be [api] host
    app = make_app(ctx)
    # stop_serving waits for requests in flight; cleanup then cancels what is left.
    runner = make_runner(app, shutdown_timeout=CANCEL_WAIT_SECONDS)
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
        within = longest_stop_seconds(ctx.config.api) - ctx.config.api.drain_delay_seconds
        with anyio.CancelScope(shield=True), anyio.move_on_after(within):
            await _close(ctx, runner)


def longest_stop_seconds(api: ApiConfig) -> float:
    """The longest ``aivedio api`` takes from SIGTERM to exit: the drain delay, the requests
    in flight, the event streams' ending, and the cancellation of what is left. A
    supervisor's grace period (terminationGracePeriodSeconds, TimeoutStopSec) exceeds it."""
    return (
        api.drain_delay_seconds
        + api.drain_timeout_seconds
        + events.CLOSE_WAIT_SECONDS
        + 2 * CANCEL_WAIT_SECONDS
    )


async def _close(ctx: ApiContext, runner: web.AppRunner) -> None:
    for site in list(runner.sites):
        await site.stop()  # the listening socket: new connections are refused from here
    ctx.stopping = True
    open_connections = len(runner.server.connections) if runner.server else 0
    log.info("api_listener_closed", open_connections=open_connections)
    await events.close_streams(ctx)
    await stop_serving(runner, ctx.config.api.drain_timeout_seconds)
