"""The [sweeper] section: how often the compensation sweep runs and what it counts as stale.

Kept apart from ``config/load.py`` like the other stage sections: only the sweeper reads it. The
times are the sweeper's margins of safety, so each says what it protects: the orphan grace
covers writers that finished an object but have not yet recorded it (a render verifying its
upload, a fetch completing its multipart upload), the processing budget separates slow work
from abandoned work, and the expiry warning is how early an output still unfetched near its
URL's expiry is escalated.
"""

from __future__ import annotations

import msgspec

from aivedio.errors import ConfigError


class SweeperConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # The periodic ``sweep`` job runs once per interval (one at a time across the fleet).
    # Workers seed the periodic sweep job at start; false leaves sweeping to `aivedio sweep`
    # (a cron job, say) or to other workers.
    periodic: bool = True
    interval_seconds: float = 300.0
    # An unreferenced object is deleted only once it is older than this.
    orphan_grace_seconds: float = 24 * 3600.0
    # QUARANTINED, PROBING or PROCESSING for longer than this with no live job: stuck.
    processing_budget_seconds: float = 2 * 3600.0
    # An output not yet STORED whose URL expires within this long is escalated.
    expiry_warning_seconds: float = 15 * 60.0
    # A multipart upload neither completed nor aborted after this long is aborted.
    multipart_stale_seconds: float = 24 * 3600.0
    # At most this many published revisions are audited per pass (0: no audit).
    audit_sample: int = 100
    # A published revision that fails the audit is rebuilt from the source when it exists.
    rebuild_on_integrity_failure: bool = True


def validate_sweeper(cfg: SweeperConfig) -> None:
    """Semantic checks that types alone cannot express. Each names the key it is about."""
    for name in (
        "interval_seconds",
        "orphan_grace_seconds",
        "processing_budget_seconds",
        "expiry_warning_seconds",
        "multipart_stale_seconds",
    ):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"config error: sweeper.{name}: must be positive")
    if cfg.audit_sample < 0:
        raise ConfigError("config error: sweeper.audit_sample: must be 0 (no audit) or more")
