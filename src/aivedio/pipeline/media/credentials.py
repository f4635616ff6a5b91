"""A video's Content Credentials as its owner and viewers see them: pure, no I/O.

One summary for every place that shows provenance (``GET /v1/assets/{id}``, ``GET
/v1/videos/{id}/status``, ``aivedio status``, the ``asset.ready`` webhook, the watch page's
badge), made from what the asset records (its source's ``Provenance``, read at the probe)
and what each published output's variant records of its signing (``Signed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from aivedio.pipeline.media.provenance import Provenance
from aivedio.pipeline.media.signing import Signed


class ContentCredentials(msgspec.Struct, frozen=True, kw_only=True):
    """``ai_generated``: what the source's manifest says (its ``digitalSourceType``), None
    when it says nothing; ``source``: the source's C2PA manifest summary (None: not read);
    ``source_verified``: its signature and hashes checked out (whoever signed it);
    ``platform_signed``: every published output that is signed was signed by this platform
    (``platform_signer``), with each output's record in ``outputs``."""

    ai_generated: bool | None
    source: Provenance | None
    source_verified: bool | None
    platform_signed: bool
    platform_signer: str | None = None
    outputs: dict[str, Signed] = {}


def content_credentials(
    provenance: Mapping[str, Any] | None, outputs: Mapping[str, Mapping[str, Any] | None]
) -> ContentCredentials | None:
    """From the asset's ``provenance`` column and each published output's ``c2pa`` record
    (None: not signed, signing off); None when there is neither."""
    source = msgspec.convert(provenance, Provenance) if provenance is not None else None
    signed = {
        name: msgspec.convert(record, Signed)
        for name, record in sorted(outputs.items())
        if record is not None
    }
    if source is None and not signed:
        return None
    signers = {s.signer for s in signed.values() if s.signed and s.signer}
    return ContentCredentials(
        ai_generated=source.ai_generated if source is not None else None,
        source=source,
        source_verified=source.verified if source is not None and source.present else None,
        platform_signed=bool(signed) and all(s.signed for s in signed.values()),
        platform_signer=min(signers) if signers else None,
        outputs=signed,
    )


def to_json(credentials: ContentCredentials | None) -> dict[str, Any] | None:
    """As JSON builtins (a webhook payload, a status document)."""
    if credentials is None:
        return None
    out: dict[str, Any] = msgspec.to_builtins(credentials)
    return out
