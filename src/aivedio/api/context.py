"""What every route handler needs, built once per API process and kept on the app."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from aivedio.api.tokens import TokenSigner
from aivedio.config import Config
from aivedio.crypto import UrlCipher
from aivedio.metrics import ApiMetrics
from aivedio.pipeline.backlog import BacklogMonitor
from aivedio.pipeline.registry import Registry
from aivedio.store.database import Pool
from aivedio.store.objects import ObjectStore
from aivedio.store.queue import Queue
from aivedio.supervision import Conditions


@dataclass
class ApiContext:
    config: Config
    pool: Pool
    store: ObjectStore
    queue: Queue
    registry: Registry
    cipher: UrlCipher
    signer: TokenSigner
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    # Set when SIGTERM arrives: /readyz turns 503 so the balancer stops sending traffic.
    draining: bool = False
    # Open Server-Sent Event streams, ended at shutdown so the server can stop.
    streams: set[web.StreamResponse] = field(default_factory=set)
    # The backlog pressure, read from the database at most once per check interval
    # (POST /v1/videos refuses new uploads while it is on). Made from config and pool.
    backlog: BacklogMonitor = field(init=False)
    # The process's supervised loops that cannot work now (the event listener): /readyz.
    conditions: Conditions = field(init=False)

    def __post_init__(self) -> None:
        self.backlog = BacklogMonitor(self.config.backlog, self.pool, self.metrics.backlog)
        self.conditions = Conditions(self.metrics.supervision)

    def base_url(self, request: web.Request) -> str:
        """The origin clients use to reach us: configured, or the one this request came in on."""
        configured = self.config.api.public_base_url
        return configured.rstrip("/") if configured else f"{request.scheme}://{request.host}"


CONTEXT = web.AppKey("aivedio_context", ApiContext)


def context(request: web.Request) -> ApiContext:
    return request.app[CONTEXT]
