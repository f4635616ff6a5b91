"""The [outbox] section: how the relay delivers events, and the webhooks it delivers to.

Kept apart from ``config/load.py`` like ``config/media.py``: only the relay reads it. The event
types live here too, because they are the contract a webhook subscribes to
(``event_types``) and the config must be checked against them before anything starts.

Webhooks are endpoints the operator configured, not URLs a provider handed us, so they do
not go through the guarded fetcher's address policy; they are still held to a plain shape
(http or https, a host, no credentials in the URL: a receiver authenticates us by the
signature, and a password in a URL ends up in logs and proxies).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import msgspec

from aivedio.errors import ConfigError

# Every event the outbox carries to consumers outside the system.
EVENT_TYPES = frozenset(
    {
        "asset.ready",
        "asset.rejected",
        "asset.invalid",
        "output.lost",
        "asset.deleted",
        "asset.integrity_failed",
    }
)

# A webhook's name is its identity in the database (its delivery rows and cursor), and it
# appears in AIVEDIO_OUTBOX__WEBHOOKS__<NAME>__… variables, which are lowercased.
_WEBHOOK_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


class WebhookConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One receiver. The body is signed with ``secret`` (its UTF-8 bytes, HMAC-SHA256)."""

    url: str
    secret: str
    timeout_seconds: float = 10.0
    # Empty: every event type.
    event_types: list[str] = msgspec.field(default_factory=list)
    # Attempts per event, the first included; then the delivery is dead.
    max_attempts: int = 12


class OutboxConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # How long the relay sleeps when nothing was due (a NOTIFY from a new event wakes it).
    poll_interval_seconds: float = 1.0
    batch_size: int = 50
    backoff_base_seconds: float = 2.0
    backoff_max_seconds: float = 600.0
    webhooks: dict[str, WebhookConfig] = msgspec.field(default_factory=dict)


def validate_outbox(config: OutboxConfig) -> None:
    """Semantic checks; each error names the key it is about."""
    for name, positive in (
        ("outbox.poll_interval_seconds", config.poll_interval_seconds),
        ("outbox.batch_size", config.batch_size),
        ("outbox.backoff_base_seconds", config.backoff_base_seconds),
    ):
        if positive <= 0:
            raise ConfigError(f"config error: {name}: must be positive")
    if config.backoff_max_seconds < config.backoff_base_seconds:
        raise ConfigError(
            "config error: outbox.backoff_max_seconds: must be at least backoff_base_seconds"
        )
    for name, hook in config.webhooks.items():
        where = f"outbox.webhooks.{name}"
        if not _WEBHOOK_NAME.fullmatch(name):
            raise ConfigError(
                f"config error: {where}: name must be lowercase letters, digits, _ or -"
                " (at most 63)"
            )
        _validate_url(hook.url, f"{where}.url")
        if not hook.secret:
            raise ConfigError(
                f"config error: {where}.secret: missing; receivers verify the signature with it"
            )
        if hook.timeout_seconds <= 0:
            raise ConfigError(f"config error: {where}.timeout_seconds: must be positive")
        if hook.max_attempts < 1:
            raise ConfigError(f"config error: {where}.max_attempts: must be at least 1")
        unknown = sorted(set(hook.event_types) - EVENT_TYPES)
        if unknown:
            raise ConfigError(
                f"config error: {where}.event_types: unknown {unknown}; "
                f"known: {sorted(EVENT_TYPES)}"
            )


def _validate_url(url: str, key: str) -> None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"config error: {key}: not a URL ({exc})") from None
    if parts.scheme not in {"http", "https"}:
        raise ConfigError(f"config error: {key}: scheme must be http or https")
    if not parts.hostname:
        raise ConfigError(f"config error: {key}: no host")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"config error: {key}: no user or password in the URL; receivers authenticate "
            "the relay by the signature"
        )
    if port == 0:
        raise ConfigError(f"config error: {key}: port 0")
    if parts.fragment:
        raise ConfigError(f"config error: {key}: no fragment")
