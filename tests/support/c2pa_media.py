"""C2PA test media: sources signed as a provider signs them, and hostile manifest stores.

``provider_signed`` signs a source with the CREATE intent and a ``c2pa.created`` action of
``digitalSourceType`` trainedAlgorithmicMedia, as an AI video provider marks its outputs,
with a chain from ``aivedio.provenance.throwaway`` (the same one ``scripts/demo`` uses).

The hostile stores are appended to a valid MP4 as a top-level C2PA ``uuid`` box after
``mdat`` (so no sample offset moves and the media itself stays valid: only the store is
hostile): ``malformed`` (a JUMBF superbox of garbage), ``deeply_nested`` (tens of
thousands of nested superboxes), ``oversized`` (a superbox that claims far more bytes than
the file has, followed by megabytes of filler).
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import c2pa

from aivedio.pipeline.media.c2pa_boxes import C2PA_BOX_UUID
from aivedio.provenance.throwaway import SigningChain

TRAINED = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
# jumd's type for a C2PA manifest store: "c2pa" then the JUMBF UUID tail.
C2PA_JUMD_TYPE = b"c2pa" + bytes.fromhex("0011001080000" + "0aa00389b71")


def provider_signed(source: Path, target: Path, chain: SigningChain) -> Path:
    """``source`` signed into ``target`` as a provider would (CREATE, trainedAlgorithmicMedia)."""
    manifest = {
        "claim_generator_info": [{"name": "example-video-provider", "version": "2026.12"}],
        "title": target.name,
        "format": "video/mp4",
        "assertions": [
            {
                "label": "c2pa.actions",
                "data": {"actions": [{"action": "c2pa.created", "digitalSourceType": TRAINED}]},
            }
        ],
    }
    info = c2pa.C2paSignerInfo(
        c2pa.C2paSigningAlg.ES256, chain.chain.encode(), chain.key.encode(), None
    )
    with c2pa.Signer.from_info(info) as signer:
        builder = c2pa.Builder(manifest)
        builder.set_intent(
            c2pa.C2paBuilderIntent.CREATE, c2pa.C2paDigitalSourceType.TRAINED_ALGORITHMIC_MEDIA
        )
        with source.open("rb") as src, target.open("w+b") as out:
            builder.sign(signer, "video/mp4", src, out)
    return target


def tampered(signed: Path, target: Path) -> Path:
    """A copy of ``signed`` with one byte of its media data changed after signing."""
    data = bytearray(signed.read_bytes())
    data[-100] ^= 0xFF
    target.write_bytes(bytes(data))
    return target


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _jumd(label: bytes) -> bytes:
    return _box(b"jumd", C2PA_JUMD_TYPE + b"\x03" + label + b"\x00")


def _with_store(source: Path, target: Path, jumbf: bytes) -> Path:
    """``source`` with a C2PA uuid box holding ``jumbf`` appended after its last box."""
    shutil.copyfile(source, target)
    payload = C2PA_BOX_UUID + b"\x00\x00\x00\x00" + b"manifest\x00" + bytes(8) + jumbf
    with target.open("ab") as out:
        out.write(_box(b"uuid", payload))
    return target


def malformed(source: Path, target: Path) -> Path:
    """A superbox whose description says C2PA and whose content is garbage."""
    garbage = bytes(range(256)) * 64
    return _with_store(source, target, _box(b"jumb", _jumd(b"c2pa") + garbage))


def deeply_nested(source: Path, target: Path, depth: int = 50_000) -> Path:
    """``depth`` superboxes, each inside the last (a recursive parser's stack)."""
    inner = _box(b"jumb", _jumd(b"c2pa.x"))
    head = _jumd(b"c2pa")
    for _ in range(depth):
        inner = _box(b"jumb", head + inner)
    return _with_store(source, target, inner)


def oversized(source: Path, target: Path, filler_bytes: int = 8 * 1024**2) -> Path:
    """A superbox claiming 2**62 bytes (a 64-bit size), then ``filler_bytes`` of filler."""
    claimed = struct.pack(">I", 1) + b"jumb" + struct.pack(">Q", 2**62)
    return _with_store(source, target, claimed + _jumd(b"c2pa") + b"\xff" * filler_bytes)
