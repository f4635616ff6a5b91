"""What every route handler needs, built once per API process and kept on the app."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from aivedio.api.token_buckets import BucketTable
from aivedio.api.tokens import TokenSigner
from aivedio.api.upload_hashes import UploadHashes
from aivedio.config.load import Config
from aivedio.crypto import UrlCipher
from aivedio.errors import ConfigError
from aivedio.metrics import ApiMetrics
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.upkeep.backlog import BacklogMonitor
from aivedio.store.database import Pool
from aivedio.store.objects.base import ObjectStore
from aivedio.store.queue import Queue
from aivedio.supervision import Conditions


@dataclass
class ApiContext:
    config: Config
    pool: Pool
    store: ObjectStore
    queue: Queue
    cipher: UrlCipher
    signer: TokenSigner
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    # Set when SIGTERM arrives: /readyz turns 503 so the balancer stops sending traffic,
    # while every other route is still served (``[api] drain_delay_seconds``).
    draining: bool = False
    # Set when the listener closes, after that delay: event streams end, new ones are refused.
    stopping: bool = False
    # Open Server-Sent Event streams, ended at shutdown so the server can stop.
    streams: set[web.StreamResponse] = field(default_factory=set)
    # The backlog pressure, read from the database at most once per check interval
    # (POST /v1/videos refuses new uploads while it is on). Made from config and pool.
    backlog: BacklogMonitor = field(init=False)
    # http://host:port the API is bound to (``run_app`` sets it once the port is known):
    # the base of absolute URLs when ``[api] public_base_url`` is empty.
    listen_base_url: str = ""
    # The process's supervised loops that cannot work now (the event listener): /readyz.
    conditions: Conditions = field(init=False)
    # On-demand stills (api/thumbnails.py): the sandbox they render in (made at the first
    # one), and a bucket per playback token.
    sandbox: Sandbox | None = None
    thumbnail_buckets: BucketTable = field(default_factory=lambda: BucketTable(50_000))
    # Resumable uploads (api/tus.py): their whole-file hashes so far, and the bound on the
    # PATCHes streaming at once (made from config).
    upload_hashes: UploadHashes = field(init=False)

    def __post_init__(self) -> None:
        self.upload_hashes = UploadHashes(self.config.api.resumable_writes)
        self.backlog = BacklogMonitor(self.config.backlog, self.pool, self.metrics.backlog)
        self.conditions = Conditions(self.metrics.supervision)

    def base_url(self) -> str:
        """What every absolute URL we hand out starts with: ``[api] public_base_url``, else
        the listen address. Never the request's Host or forwarding headers (a client writes
        those: a forged one would point another client's token or upload at the forger)."""
        base = self.config.api.public_base_url.rstrip("/") or self.listen_base_url
        if not base:
            raise ConfigError("config error: api.public_base_url: unset, and not listening yet")
        return base


CONTEXT = web.AppKey("aivedio_context", ApiContext)


def context(request: web.Request) -> ApiContext:
    return request.app[CONTEXT]
