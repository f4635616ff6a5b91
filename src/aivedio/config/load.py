"""Configuration: one TOML file, decoded once into frozen structs, then the environment.

Precedence, lowest first: the defaults written here, the TOML file (``--config`` or
``AIVEDIO_CONFIG``), then environment variables. Two kinds of variable are read:

* the documented aliases in ``ENV_ALIASES`` (``AIVEDIO_DATABASE_URL`` and friends), and
* ``AIVEDIO_<SECTION>__<KEY>`` for any key, nested sections joined by ``__``
  (``AIVEDIO_WORKER__DRAIN_TIMEOUT_SECONDS=10``). Values are parsed as TOML values when they
  parse (numbers, booleans, arrays) and taken as strings otherwise.

Every problem is a ``ConfigError`` whose message names the key, so an operator never has to
guess which line of which file was wrong. Nothing starts on a bad configuration.

This module holds the whole ``Config``, the small process-wide sections ([database],
[storage], [security], [log], [diagnostics]), the loader, the validation driver and the
masking. Every other section, with its own checks, lives in ``config/<section>.py``; the
names of [net], [providers.NAME] and [worker] stay importable from here (``X as X``).
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
from aivedio.config.net import FetchConfig
from aivedio.config.net import NetConfig as NetConfig
from aivedio.config.net import ProviderConfig as ProviderConfig
from aivedio.config.net import validate_net as validate_net
from aivedio.config.outbox import OutboxConfig, validate_outbox
from aivedio.config.provenance import ProvenanceConfig, validate_provenance
from aivedio.config.sweeper import SweeperConfig, validate_sweeper
from aivedio.config.worker import LaneConfig as LaneConfig
from aivedio.config.worker import QueueConfig, default_lanes, validate_worker
from aivedio.config.worker import WorkerConfig as WorkerConfig
from aivedio.config.worker import claim_poll_seconds as claim_poll_seconds
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
        "secrets",
        "playback_token_secret",
        "api_key",
        "secret_key",
        "webhook_secret",
        "extra_webhook_secrets",
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
    # The checksum each part (and single put) of a fetch's or an output's upload carries,
    # which the engine verifies: "sha256" (the default) or "crc32" (a third of the CPU, as
    # boto3 does by default; store/objects/part_checksums.py). The object's SHA-256 is the
    # integrity guarantee either way. Resumable uploads always use SHA-256 parts.
    s3_part_checksum: str = "sha256"


class SecurityConfig(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    url_encryption_key: str = ""
    url_encryption_key_id: str = "k1"
    # Older keys by id, kept to decrypt what they encrypted (rotation).
    previous_url_encryption_keys: dict[str, str] = msgspec.field(default_factory=dict)


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
    provenance: ProvenanceConfig = msgspec.field(default_factory=ProvenanceConfig)
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
            worker["lanes"] = msgspec.to_builtins(default_lanes())
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
    if config.storage.s3_part_checksum not in {"sha256", "crc32"}:  # part_checksums.BY_NAME
        raise ConfigError("config error: storage.s3_part_checksum: one of sha256, crc32")
    validate_worker(config.worker, config.queue)
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
    validate_provenance(config.provenance)


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
