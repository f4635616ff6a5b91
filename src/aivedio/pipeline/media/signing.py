"""The one seam between the media pipeline and C2PA signing: ``OutputSigner``.

The pipeline never imports c2pa: it hands a made file to an ``OutputSigner`` before the file
is hashed and recorded (``pipeline/ffmpeg/finalize.py``), so the SHA-256 recorded, uploaded
and checked on every read is the signed file's. ``provenance/signing.py`` is the real one
(c2pa-python's ``Builder``), built by the faces (worker, ``aivedio process``) from
``[provenance]``; without a configured signer there is none and nothing is signed.

What the platform's manifest says of an output is decided here, purely: the actions
(``actions_for``) from how the output was made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec

from aivedio.pipeline.media.provenance import Provenance

REPACKAGED = "c2pa.repackaged"
TRANSCODED = "c2pa.transcoded"
RESIZED = "c2pa.resized"


class SignRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One output to sign in place. ``source_path``: the source, added as the ``parentOf``
    ingredient (carrying its manifest store when it has one); ``source``: what the
    sandboxed reader found in that store (None: not read)."""

    output: str  # playback | proxy | poster
    path: str
    mime: str
    actions: list[str]
    source_path: str | None = None
    source_mime: str | None = None
    source: Provenance | None = None


class Signed(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What an output's variant records of its signing: signed (with the manifest label of
    the platform's manifest and whether the source's store was kept as its ingredient), or
    published unsigned with the reason."""

    signed: bool
    manifest_label: str | None = None
    signer: str | None = None
    parent_manifest: bool = False
    unsigned_reason: str | None = None


class OutputSigner(Protocol):
    """Signs made outputs with the platform's C2PA manifest."""

    async def sign(self, request: SignRequest) -> Signed:
        """Sign ``request.path`` in place (the file is replaced by the signed one).
        Raises ``SigningError`` when it cannot."""
        ...


@dataclass(frozen=True)
class Signing:
    """A media run's signing: the signer, the outputs it signs, and whether an output whose
    signing failed is published unsigned (its reason recorded) instead of failing."""

    signer: OutputSigner
    outputs: frozenset[str]
    publish_unsigned: bool = False


def actions_for(output: str, *, copied: bool, resized: bool) -> list[str]:
    """The platform's actions on ``output``: a copied bitstream is repackaged, anything
    encoded again is transcoded (a poster is a frame encoded as JPEG), and a picture of
    another size than the source's is resized too."""
    actions = [REPACKAGED if copied and output != "poster" else TRANSCODED]
    if resized:
        actions.append(RESIZED)
    return actions
