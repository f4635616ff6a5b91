"""The [outbox] section: how the relay delivers events, and the webhooks it delivers to.

Kept apart from ``config/load.py`` like ``config/media.py``: only the relay reads it. The event
types live here too, because they are the contract a webhook subscribes to
(``event_types``) and the config must be checked against them before anything starts.

Webhooks are endpoints the operator configured, not URLs a provider handed us, so they do
not go through the guarded fetcher's address policy; they are still held to a plain shape
(http or https, a host, no credentials in the URL: a receiver authenticates us by the
signature, and a password in a URL ends up in logs and proxies).

Secrets are Standard Webhooks secrets: ``whsec_`` and the base64 of the HMAC key. A webhook
holds a list (``secrets``) because a rotation has two live at once: the relay signs each
delivery with every one, the receiver accepts any match, and the old one is removed once
every receiver has the new. The single ``secret`` of earlier versions is still read, as a
deprecated form: its UTF-8 bytes are the key (so ``whsec_`` + base64 of it is the same secret
in the new form) and the relay adds the legacy ``X-Aivedio-Signature`` headers for it, so a
receiver written against them keeps working until the operator moves it to ``secrets``.
"""

from __future__ import annotations

import base64
import binascii
import os
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

SECRET_PREFIX = "whsec_"  # noqa: S105 - the scheme's prefix, not a secret
# The Standard Webhooks specification asks for keys of 24 to 64 random bytes.
MIN_SECRET_KEY_BYTES = 24
MAX_SECRET_KEY_BYTES = 64


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret; ValueError (naming no part of the value)
    when it is not one, or its key is not 24 to 64 bytes."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a secret is whsec_ followed by base64")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a secret is whsec_ followed by base64") from None
    if not MIN_SECRET_KEY_BYTES <= len(key) <= MAX_SECRET_KEY_BYTES:
        raise ValueError(
            f"a secret's key is {MIN_SECRET_KEY_BYTES} to {MAX_SECRET_KEY_BYTES} bytes"
            f" (this one: {len(key)})"
        )
    return key


def new_secret() -> str:
    """A fresh secret: ``whsec_`` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()


class WebhookConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One receiver. Each delivery is signed with every key of ``secrets`` (Standard
    Webhooks), or with the deprecated ``secret`` (its UTF-8 bytes as the key)."""

    url: str
    # whsec_ secrets, all live: two during a rotation. Exactly one of secrets and secret.
    secrets: list[str] = msgspec.field(default_factory=list)
    # Deprecated: one plain secret; adds the legacy X-Aivedio-Signature headers.
    secret: str = ""
    timeout_seconds: float = 10.0
    # Empty: every event type.
    event_types: list[str] = msgspec.field(default_factory=list)
    # How long after its first attempt a delivery is retried (the last attempt lands at the
    # end of the window); then it is dead, for an operator's replay.
    retry_for_seconds: float = 86400.0
    # An optional cap on attempts per event, the first included (0: the window alone).
    max_attempts: int = 0

    @property
    def legacy(self) -> bool:
        """Configured with the deprecated single ``secret``."""
        return not self.secrets and bool(self.secret)

    def signing_keys(self) -> list[bytes]:
        """The HMAC keys each delivery is signed with (validated: ``validate_outbox``)."""
        if self.legacy:
            return [self.secret.encode()]
        return [secret_key(s) for s in self.secrets]


class OutboxConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # How long the relay sleeps when nothing was due (a NOTIFY from a new event wakes it).
    poll_interval_seconds: float = 1.0
    batch_size: int = 50
    backoff_base_seconds: float = 2.0
    # Full-jitter exponential backoff between attempts: uniform in [0, min(max, base·2^n)].
    # With a 1 h cap a day's window holds about 50 attempts, the later ones about 30 min
    # apart on average.
    backoff_max_seconds: float = 3600.0
    webhooks: dict[str, WebhookConfig] = msgspec.field(default_factory=dict)
    # Deliver tenants' own receivers (POST /v1/webhooks) too. Only workers with fetch slots
    # do (they have egress anyway): a media-only node still needs none.
    tenant_webhooks: bool = True
    tenant_webhook_timeout_seconds: float = 10.0


def validate_outbox(config: OutboxConfig) -> None:
    """Semantic checks; each error names the key it is about."""
    for name, positive in (
        ("outbox.poll_interval_seconds", config.poll_interval_seconds),
        ("outbox.batch_size", config.batch_size),
        ("outbox.backoff_base_seconds", config.backoff_base_seconds),
        ("outbox.tenant_webhook_timeout_seconds", config.tenant_webhook_timeout_seconds),
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
        _validate_secrets(hook, where)
        if hook.timeout_seconds <= 0:
            raise ConfigError(f"config error: {where}.timeout_seconds: must be positive")
        if hook.max_attempts < 0:
            raise ConfigError(f"config error: {where}.max_attempts: must be at least 1 (0: no cap)")
        if hook.retry_for_seconds < 0:
            raise ConfigError(f"config error: {where}.retry_for_seconds: must not be negative")
        unknown = sorted(set(hook.event_types) - EVENT_TYPES)
        if unknown:
            raise ConfigError(
                f"config error: {where}.event_types: unknown {unknown}; "
                f"known: {sorted(EVENT_TYPES)}"
            )


def _validate_secrets(hook: WebhookConfig, where: str) -> None:
    if hook.secrets and hook.secret:
        raise ConfigError(
            f"config error: {where}.secret: deprecated, and secrets is set too; move it into"
            f' secrets as "whsec_" + its base64 (the same key), or remove it'
        )
    if not hook.secrets and not hook.secret:
        raise ConfigError(
            f"config error: {where}.secrets: missing; receivers verify the signature with them"
            " (whsec_ + base64 of 24 to 64 random bytes)"
        )
    if len(set(hook.secrets)) != len(hook.secrets):
        raise ConfigError(f"config error: {where}.secrets: listed twice")
    for n, secret in enumerate(hook.secrets):
        try:
            secret_key(secret)
        except ValueError as exc:
            raise ConfigError(f"config error: {where}.secrets[{n}]: {exc}") from None


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
