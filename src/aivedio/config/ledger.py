"""The [ledger] section: what a generation and a publish cost, and what a loss gives back.

Kept apart from ``config/load.py`` because only the ledger reads it. Prices are integers in
millionths of ``currency`` (micros) so that sums are exact. The policies decide whether an
entry is written, never how an existing one changes: the ledger is append-only
(``store/ledger.py``), so a policy change applies to facts recorded after it.

A provider with no price still gets its generation charge recorded, with amount 0 and
policy ``unpriced``: the fact that the provider billed a task is kept even before anyone has
priced it, and reconciliation can find every such row.
"""

from __future__ import annotations

import re

import msgspec

from aivedio.errors import ConfigError

PROCESSING_CHARGES = ("on_publish", "never")
COMPENSATIONS = ("refund_generation", "none")
_CURRENCY = re.compile(r"[A-Z]{3}")


class LedgerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # ISO 4217 code of every new entry; a compensation takes the currency of its charge.
    currency: str = "USD"
    # Generation price by provider: a fixed part per task plus a part per second of output.
    generation_micros_per_task: dict[str, int] = msgspec.field(default_factory=dict)
    generation_micros_per_second: dict[str, int] = msgspec.field(default_factory=dict)
    # The platform's processing charge: "on_publish" (once per published revision, by the
    # media seconds processed) or "never".
    processing_charge: str = "on_publish"
    processing_micros_per_media_second: int = 0
    # After the provider succeeded but the output is lost or the platform fails:
    # "refund_generation" (credit the generation charge back, once per provider task) or
    # "none" (the charge stands; nothing is written).
    compensation: str = "refund_generation"


def validate_ledger(cfg: LedgerConfig) -> None:
    """Semantic checks that types alone cannot express. Each names the key it is about."""
    if not _CURRENCY.fullmatch(cfg.currency):
        raise ConfigError("config error: ledger.currency: an ISO 4217 code such as USD")
    for name, prices in (
        ("generation_micros_per_task", cfg.generation_micros_per_task),
        ("generation_micros_per_second", cfg.generation_micros_per_second),
    ):
        for provider, micros in prices.items():
            if not provider:
                raise ConfigError(f"config error: ledger.{name}: a provider name is empty")
            if micros < 0:
                raise ConfigError(f"config error: ledger.{name}.{provider}: must be >= 0")
    if cfg.processing_micros_per_media_second < 0:
        raise ConfigError("config error: ledger.processing_micros_per_media_second: must be >= 0")
    if cfg.processing_charge not in PROCESSING_CHARGES:
        raise ConfigError(
            f"config error: ledger.processing_charge: one of {', '.join(PROCESSING_CHARGES)}"
        )
    if cfg.compensation not in COMPENSATIONS:
        raise ConfigError(f"config error: ledger.compensation: one of {', '.join(COMPENSATIONS)}")
