"""Configuration: one TOML file, decoded once into frozen structs, then the environment.

Precedence, lowest first: the defaults written here, the TOML file (``--config`` or
``AIVEDIO_CONFIG``), then environment variables. Two kinds of variable are read:

* the documented aliases in ``ENV_ALIASES`` (``AIVEDIO_DATABASE_URL`` and friends), and
* ``AIVEDIO_<SECTION>__<KEY>`` for any key, nested sections joined by ``__``
  (``AIVEDIO_WORKER__DRAIN_TIMEOUT_SECONDS=10``). Values are parsed as TOML values when they
  parse (numbers, booleans, arrays) and taken as strings otherwise.

Every problem is a ``ConfigError`` whose message names the key, so an operator never has to
guess which line of which file was wrong. Nothing starts on a bad configuration.
"""

from __future__ import annotations

import base64
import binascii
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from aivedio.config.api import ApiConfig, validate_api
from aivedio.config.backlog import BacklogConfig, validate_backlog
from aivedio.config.ledger import LedgerConfig, validate_ledger
from aivedio.config.media import MediaConfig, validate_media
from aivedio.config.moderation import ModerationConfig, validate_moderation
from aivedio.config.outbox import OutboxConfig, validate_outbox
from aivedio.config.sweeper import SweeperConfig, validate_sweeper
from aivedio.errors import ConfigError

ENV_PREFIX = "AIVEDIO_"
ENV_CONFIG_PATH = "AIVEDIO_CONFIG"
ENV_ALIASES: Mapping[str, tuple[str, ...]] = {
    "AIVEDIO_DATABASE_URL": ("database", "url"),
    "AIVEDIO_STORAGE_URL": ("storage", "url"),
    "AIVEDIO_S3_ENDPOINT_URL": ("storage", "s3_endpoint_url"),
    "AIVEDIO_URL_ENCRYPTION_KEY": ("security", "url_encryption_key"),
    "AIVEDIO_PLAYBACK_TOKEN_SECRET": ("api", "playback_token_secret"),
}
# Keys whose values are secrets: masked by ``config check`` and never logged.
SECRET_KEYS = frozenset(
    {
        "url_encryption_key",
        "previous_url_encryption_keys",
        "s3_secret_access_key",
        "password",
        "auth_header",
        "callback_secret",
        "secret",
        "playback_token_secret",
        "api_key",
        "secret_key",
        "webhook_secret",
    }
)


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class DatabaseConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    url: str = "postgresql://postgres@127.0.0.1:5432/aivedio"
    pool_min_size: int = 2
    pool_max_size: int = 8
    statement_timeout_seconds: float = 30.0
    idle_in_transaction_timeout_seconds: float = 60.0
    connect_timeout_seconds: float = 10.0


class StorageConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    url: str = "file:///var/tmp/aivedio/objects"
    s3_endpoint_url: str = ""
    s3_region: str = "us-east-1"
    s3_access_key_id: str = ""
    s3_secret_access_key: str = ""


class LaneConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    slots: int


def _default_lanes() -> dict[str, LaneConfig]:
    return {
        "fetch": LaneConfig(slots=16),
        "media": LaneConfig(slots=2),
        "control": LaneConfig(slots=8),
    }


class WorkerConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    http_host: str = "127.0.0.1"
    http_port: int = 9464
    drain_timeout_seconds: float = 30.0
    lease_seconds: float = 30.0
    heartbeat_interval_seconds: float = 5.0
    poll_interval_seconds: float = 1.0
    # How long a lane that found nothing waits, unwoken, before asking again (every way a
    # job becomes claimable notifies, so this is a safety net); default 5 x the poll interval.
    claim_poll_seconds: float | None = None
    claim_batch_max: int = 32
    ack_batch_max: int = 64
    # How long a finished job's acknowledgement waits for a claim to carry it (one round
    # trip for both) before it is sent on its own.
    ack_flush_seconds: float = 0.25
    lanes: dict[str, LaneConfig] = msgspec.field(default_factory=_default_lanes)


def claim_poll_seconds(worker: WorkerConfig) -> float:
    """``worker.claim_poll_seconds``, or its default: 5 x ``worker.poll_interval_seconds``."""
    if worker.claim_poll_seconds is None:
        return 5 * worker.poll_interval_seconds
    return worker.claim_poll_seconds


class QueueConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    max_attempts: int = 8
    backoff_base_seconds: float = 2.0
    backoff_max_seconds: float = 600.0
    # A job without an expiry should start within this long; it ages into the order as if
    # this were its deadline, so deadline-bearing jobs cannot starve it.
    default_start_within_seconds: float = 3600.0
    retry_penalty_seconds: float = 30.0
    max_tenants_per_claim: int = 64


class SecurityConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    url_encryption_key: str = ""
    url_encryption_key_id: str = "k1"
    # Older keys by id, kept to decrypt what they encrypted (rotation).
    previous_url_encryption_keys: dict[str, str] = msgspec.field(default_factory=dict)


class NetConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The guarded fetch's policy and limits; [providers.NAME] sections may narrow them."""

    allowed_schemes: list[str] = msgspec.field(default_factory=lambda: ["https"])
    allowed_ports: list[int] = msgspec.field(default_factory=lambda: [443])
    # Empty: any public host. Otherwise "name" allows that host exactly and ".name" its
    # subdomains only (docs/security.md).
    allowed_host_suffixes: list[str] = msgspec.field(default_factory=list)
    # The only exception to the deny table (for tests and labs): e.g. ["127.0.0.0/8"].
    allow_cidrs: list[str] = msgspec.field(default_factory=list)
    # DNS servers as "ip" or "ip:port"; empty: the system's resolv.conf.
    nameservers: list[str] = msgspec.field(default_factory=list)
    # Extra CA bundle (PEM) trusted for provider TLS, besides the system store.
    ca_file: str = ""
    max_bytes: int = 4 * 1024**3
    max_redirects: int = 5
    connect_timeout_seconds: float = 10.0
    header_timeout_seconds: float = 30.0
    idle_read_timeout_seconds: float = 30.0
    total_timeout_seconds: float = 3600.0
    per_host_connections: int = 8
    # Further requests for one body after it was cut short (0: never resume).
    max_resumes: int = 5
    # Wait before the second resume of a fetch, doubled for each further one.
    resume_backoff_seconds: float = 1.0


# The vendor adapters (src/aivedio/providers/); "generic" is the configurable one below.
ADAPTER_KINDS = frozenset(
    {
        "generic",
        "runway",
        "openai",
        "veo_gemini",
        "veo_vertex",
        "replicate",
        "fal",
        "luma",
        "kling",
        "minimax",
    }
)


class ProviderConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One provider. Unset net keys fall back to [net]; set ones may only narrow it.

    ``adapter`` picks the vendor's adapter (docs/providers.md); an unset ``api_base_url``
    means the vendor's public API. Vendor credentials (``api_key``, Kling's key pair) are
    secrets: sent to the vendor's own API origin (and its download origin where the
    vendor requires it), never across a redirect to another host, never logged."""

    adapter: str = "generic"
    api_base_url: str = ""
    task_path: str = "/v1/tasks/{task_id}"
    refresh_path: str = "/v1/tasks/{task_id}/outputs/{output_index}/refresh"
    auth_header: str = ""  # secret, e.g. "Bearer …"; sent to this provider's hosts only
    callback_secret: str = ""  # secret for HMAC-signed callbacks
    # The tenant a callback for a task we never saw belongs to (one provider account per
    # tenant); a callback for a known task always keeps that task's tenant.
    tenant: str = ""
    default_url_ttl_seconds: float = 3600.0
    allowed_host_suffixes: list[str] | None = None
    allowed_ports: list[int] | None = None
    max_bytes: int | None = None
    # Vendor adapters. api_key: OpenAI, Replicate, Runway, Luma, MiniMax bearer; Gemini API
    # key; Vertex access token (also sent to download_base_url for GCS); fal "Key" auth.
    api_key: str = ""
    access_key: str = ""  # Kling: the JWT issuer
    secret_key: str = ""  # Kling: the JWT's HMAC key (secret)
    webhook_secret: str = ""  # Standard Webhooks "whsec_..." (OpenAI, Replicate)
    jwks: str = ""  # fal: the JWKS document itself, or
    jwks_url: str = ""  # fal: where to fetch it (through the guarded fetcher), cached
    jwks_cache_seconds: float = 3600.0
    app_id: str = ""  # fal: the app's queue path, e.g. "fal-ai/pika"
    task_type: str = "text2video"  # Kling: the {type} of /v1/videos/{type}/{task_id}
    download_base_url: str = ""  # Gemini files / GCS download origin (default: the vendor's)
    # Polling: None means the vendor's documented cadence (or our assumption, docs/providers.md).
    poll_interval_seconds: float | None = None
    poll_jitter_seconds: float | None = None
    poll_requests_per_second: float = 2.0  # per worker process, for this provider
    watch_max_seconds: float = 2 * 86400.0  # give a watched task up after this long


class FetchConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pipeline_version: int = 1
    part_size_bytes: int = 8 * 1024**2
    # Memory per fetch is about part_size_bytes x (parts_in_flight + 1); two in flight
    # keep the store busy while the next part fills (see docs/benchmarks.md).
    parts_in_flight: int = 2
    # A 404 right after success may be a CDN not yet filled: retried this many times, then
    # treated like an expired URL (refresh).
    not_yet_available_attempts: int = 3
    # Per-provider circuit breaker on 5xx and connection failures.
    breaker_failures: int = 5
    breaker_open_seconds: float = 30.0
    estimated_bytes_per_second: float = 20 * 1024**2


class LogConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    level: str = "info"
    format: str = "json"


class DiagnosticsConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # When set, diagnostic jobs append their executions here (one file per process).
    execution_journal_dir: str = ""


class Config(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    database: DatabaseConfig = msgspec.field(default_factory=DatabaseConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    worker: WorkerConfig = msgspec.field(default_factory=WorkerConfig)
    queue: QueueConfig = msgspec.field(default_factory=QueueConfig)
    security: SecurityConfig = msgspec.field(default_factory=SecurityConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    diagnostics: DiagnosticsConfig = msgspec.field(default_factory=DiagnosticsConfig)
    net: NetConfig = msgspec.field(default_factory=NetConfig)
    fetch: FetchConfig = msgspec.field(default_factory=FetchConfig)
    media: MediaConfig = msgspec.field(default_factory=MediaConfig)
    moderation: ModerationConfig = msgspec.field(default_factory=ModerationConfig)
    ledger: LedgerConfig = msgspec.field(default_factory=LedgerConfig)
    outbox: OutboxConfig = msgspec.field(default_factory=OutboxConfig)
    sweeper: SweeperConfig = msgspec.field(default_factory=SweeperConfig)
    api: ApiConfig = msgspec.field(default_factory=ApiConfig)
    backlog: BacklogConfig = msgspec.field(default_factory=BacklogConfig)
    providers: dict[str, ProviderConfig] = msgspec.field(default_factory=dict)

    @property
    def url_encryption_key_bytes(self) -> bytes:
        return base64.b64decode(self.security.url_encryption_key)


def load_config(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    require_secrets: bool = True,
) -> Config:
    """Read the file (if any), apply the environment, decode and validate. Raises ConfigError."""
    env = os.environ if environ is None else environ
    if path is None:
        path = env.get(ENV_CONFIG_PATH) or None
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_toml(Path(path))
    _apply_env(raw, env)
    _check_unknown_keys(raw, Config, "")
    try:
        config = msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(_describe_validation_error(str(exc))) from None
    validate(config, require_secrets=require_secrets)
    return config


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read ({exc.strerror})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML ({exc})") from None


def _check_unknown_keys(raw: Any, struct: type[msgspec.Struct], where: str) -> None:
    """Name unknown keys by their full dotted path, dictionary keys included (msgspec's own
    message says ``lanes[...]`` and loses which lane)."""
    if not isinstance(raw, dict):
        return
    fields = {f.name: f.type for f in msgspec.structs.fields(struct)}
    for key, value in raw.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            raise ConfigError(f"config error: {path}: unknown key")
        kind = fields[key]
        if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
            _check_unknown_keys(value, kind, path)
        elif getattr(kind, "__origin__", None) is dict and isinstance(value, dict):
            item = kind.__args__[1]
            if isinstance(item, type) and issubclass(item, msgspec.Struct):
                for name, entry in value.items():
                    _check_unknown_keys(entry, item, f"{path}.{name}")


def _parse_env_value(value: str) -> Any:
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def _set_path(raw: dict[str, Any], keys: tuple[str, ...], value: Any, origin: str) -> None:
    node = raw
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {'.'.join(keys)}: {key} is not a section")
        node = child
    node[keys[-1]] = value


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    lane_prefix = f"{ENV_PREFIX}WORKER__LANES__"
    if any(name.startswith(lane_prefix) for name in env):
        # Overriding one lane must not drop the default lanes the file did not list.
        worker = raw.setdefault("worker", {})
        if isinstance(worker, dict) and "lanes" not in worker:
            worker["lanes"] = msgspec.to_builtins(_default_lanes())
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG_PATH:
            continue
        if name in ENV_ALIASES:
            _set_path(raw, ENV_ALIASES[name], value, name)
        elif "__" in name:
            keys = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
            if not all(keys):
                raise ConfigError(f"{name}: malformed variable name")
            _set_path(raw, keys, _parse_env_value(value), name)


def _describe_validation_error(message: str) -> str:
    # msgspec says e.g. "Object contains unknown field `x` - at `$.worker`"; we say "worker.x".
    text, _, where = message.partition(" - at `")
    where = where.rstrip("`").removeprefix("$").lstrip(".")
    if "unknown field `" in text:
        field = text.split("`")[1]
        key = f"{where}.{field}" if where else field
        return f"config error: {key}: unknown key"
    return f"config error: {where or '(top level)'}: {text}"


def validate(config: Config, *, require_secrets: bool = True) -> None:
    """Semantic checks that types alone cannot express. Each names the key it is about."""
    db = urlsplit(config.database.url)
    if db.scheme not in {"postgresql", "postgres"}:
        raise ConfigError("config error: database.url: must be a postgresql:// URL")
    if not 1 <= config.database.pool_min_size <= config.database.pool_max_size:
        raise ConfigError("config error: database.pool_min_size: must be 1..pool_max_size")
    storage = urlsplit(config.storage.url)
    if storage.scheme == "file":
        if not storage.path.startswith("/") or storage.netloc:
            raise ConfigError("config error: storage.url: file URLs must be file:///absolute/dir")
    elif storage.scheme == "s3":
        if not storage.netloc:
            raise ConfigError("config error: storage.url: s3 URLs must be s3://bucket[/prefix]")
    else:
        raise ConfigError("config error: storage.url: scheme must be file or s3")
    worker = config.worker
    if not 0 <= worker.http_port <= 65535:
        raise ConfigError("config error: worker.http_port: must be 0..65535")
    if worker.heartbeat_interval_seconds * 2 > worker.lease_seconds:
        raise ConfigError(
            "config error: worker.heartbeat_interval_seconds: must be at most half of "
            "worker.lease_seconds, or leases expire between heartbeats"
        )
    for name, positive in (
        ("worker.drain_timeout_seconds", worker.drain_timeout_seconds),
        ("worker.poll_interval_seconds", worker.poll_interval_seconds),
        ("worker.claim_poll_seconds", claim_poll_seconds(worker)),
        ("worker.claim_batch_max", worker.claim_batch_max),
        ("worker.ack_batch_max", worker.ack_batch_max),
        ("queue.max_attempts", config.queue.max_attempts),
        ("queue.backoff_base_seconds", config.queue.backoff_base_seconds),
        ("queue.max_tenants_per_claim", config.queue.max_tenants_per_claim),
    ):
        if positive <= 0:
            raise ConfigError(f"config error: {name}: must be positive")
    if not worker.lanes:
        raise ConfigError("config error: worker.lanes: at least one lane is needed")
    for lane, lane_config in worker.lanes.items():
        if lane_config.slots < 0:
            raise ConfigError(f"config error: worker.lanes.{lane}.slots: must be >= 0")
    if config.log.level.lower() not in {"debug", "info", "warning", "error"}:
        raise ConfigError("config error: log.level: one of debug, info, warning, error")
    if config.log.format not in {"json", "console"}:
        raise ConfigError("config error: log.format: one of json, console")
    if require_secrets or config.security.url_encryption_key:
        _validate_key(config.security.url_encryption_key)
    for key_id, key in config.security.previous_url_encryption_keys.items():
        _validate_key(key, f"security.previous_url_encryption_keys.{key_id}")
    validate_net(config)
    validate_media(config.media)
    validate_moderation(config.moderation)
    validate_ledger(config.ledger)
    validate_outbox(config.outbox)
    validate_sweeper(config.sweeper)
    validate_api(config.api)
    for name in config.api.rate_limits.callback_providers:
        if name not in config.providers:
            raise ConfigError(
                f"config error: api.rate_limits.callback_providers.{name}: no [providers.{name}]"
            )
    validate_backlog(config.backlog)


def validate_net(config: Config) -> None:
    import ipaddress

    from aivedio.net.policy import check_host_suffixes, host_suffix_within

    net = config.net
    sections = [("net", net.allowed_host_suffixes)]
    sections += [
        (f"providers.{n}", pc.allowed_host_suffixes or []) for n, pc in config.providers.items()
    ]
    for where, entries in sections:
        try:
            check_host_suffixes(entries)
        except ValueError as exc:
            raise ConfigError(f"config error: {where}.allowed_host_suffixes: {exc}") from None
    for scheme in net.allowed_schemes:
        if scheme not in {"https", "http"}:
            raise ConfigError(f"config error: net.allowed_schemes: {scheme!r} is not http(s)")
    for cidr in net.allow_cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"config error: net.allow_cidrs: {cidr!r} is not a CIDR") from None
    for name, positive in (
        ("net.max_bytes", net.max_bytes),
        ("net.connect_timeout_seconds", net.connect_timeout_seconds),
        ("net.header_timeout_seconds", net.header_timeout_seconds),
        ("net.idle_read_timeout_seconds", net.idle_read_timeout_seconds),
        ("net.total_timeout_seconds", net.total_timeout_seconds),
        ("net.per_host_connections", net.per_host_connections),
        ("fetch.parts_in_flight", config.fetch.parts_in_flight),
    ):
        if positive <= 0:
            raise ConfigError(f"config error: {name}: must be positive")
    for name, value in (
        ("net.max_resumes", net.max_resumes),
        ("net.resume_backoff_seconds", net.resume_backoff_seconds),
    ):
        if value < 0:
            raise ConfigError(f"config error: {name}: must not be negative")
    if config.fetch.part_size_bytes < 5 * 1024**2:
        raise ConfigError("config error: fetch.part_size_bytes: S3 needs at least 5 MiB parts")
    for provider, pc in config.providers.items():
        where = f"providers.{provider}"
        if pc.adapter not in ADAPTER_KINDS:
            raise ConfigError(
                f"config error: {where}.adapter: one of {', '.join(sorted(ADAPTER_KINDS))}"
            )
        if pc.poll_requests_per_second <= 0 or pc.watch_max_seconds <= 0:
            raise ConfigError(
                f"config error: {where}.poll_requests_per_second and watch_max_seconds: "
                "must be positive"
            )
        for key in ("api_base_url", "download_base_url", "jwks_url"):
            value = getattr(pc, key)
            if value and urlsplit(value).scheme not in net.allowed_schemes:
                raise ConfigError(f"config error: {where}.{key}: scheme not in net.allowed_schemes")
        if pc.allowed_ports is not None and not set(pc.allowed_ports) <= set(net.allowed_ports):
            raise ConfigError(
                f"config error: {where}.allowed_ports: may only narrow net.allowed_ports"
            )
        if pc.allowed_host_suffixes is not None and net.allowed_host_suffixes:
            for suffix in pc.allowed_host_suffixes:
                if not host_suffix_within(suffix, net.allowed_host_suffixes):
                    raise ConfigError(
                        f"config error: {where}.allowed_host_suffixes: {suffix!r} is not "
                        "inside net.allowed_host_suffixes (a provider may only narrow it; "
                        '"name" is that host only, ".name" its subdomains)'
                    )
        if pc.max_bytes is not None and not 0 < pc.max_bytes <= net.max_bytes:
            raise ConfigError(f"config error: {where}.max_bytes: must be in 1..net.max_bytes")
        # An expiry derived from it must fit the window of a time from outside (untrusted.py).
        if not 0 < pc.default_url_ttl_seconds <= 400 * 86400:
            raise ConfigError(
                f"config error: {where}.default_url_ttl_seconds: must be in (0, 34560000] "
                "(400 days)"
            )


def _validate_key(value: str, name: str = "") -> None:
    name = name or "security.url_encryption_key (or AIVEDIO_URL_ENCRYPTION_KEY)"
    if not value:
        raise ConfigError(
            f"config error: {name}: missing secret; set it to base64 of 32 random bytes "
            "(for example: openssl rand -base64 32)"
        )
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"config error: {name}: not valid base64") from None
    if len(key) != 32:
        raise ConfigError(f"config error: {name}: must decode to 32 bytes, got {len(key)}")


def masked(config: Config) -> dict[str, Any]:
    """The effective configuration as plain data, with every secret replaced by a mask."""
    data: dict[str, Any] = _mask(msgspec.to_builtins(config))
    return data


def _mask(node: Any) -> Any:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in SECRET_KEYS and value:
                out[key] = "***"
            elif (key == "url" or key.endswith("_url")) and isinstance(value, str):
                out[key] = _mask_url(value)
            else:
                out[key] = _mask(value)
        return out
    return node


def _mask_url(url: str) -> str:
    """A URL's password and whole query string (libpq takes ?password=…) are masked."""
    parts = urlsplit(url)
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    if parts.query:
        parts = parts._replace(query="***")
    return parts.geturl()
