"""The source's C2PA manifest store read in the sandbox (real c2pa-rs in a child under
prlimit and ``unshare -n``), as the probe reads it: what each kind of store is recorded as,
hostile stores refused without harm, and ``require_provenance`` turning a missing or
invalid store into INVALID_MEDIA."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from aivedio.config.media import MediaConfig
from aivedio.config.provenance import ProvenanceConfig
from aivedio.pipeline.ffmpeg.provenance_read import ProvenanceReader
from aivedio.pipeline.ffmpeg.sandbox import RunResult, Sandbox
from aivedio.pipeline.ffmpeg.verdict import Verdict, inspect_file
from aivedio.provenance.throwaway import SigningChain, make_chain
from tests.support import c2pa_media
from tests.support import media_fixtures as mf

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class Sources:
    unsigned: Path
    signed: Path
    tampered: Path
    malformed: Path
    deeply_nested: Path
    oversized: Path
    anchors: Path
    chain: SigningChain


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Sources:
    directory = tmp_path_factory.mktemp("c2pa")
    chain = make_chain("Example Video Provider")
    unsigned = mf.h264_faststart(directory, seconds=2)
    signed = c2pa_media.provider_signed(unsigned, directory / "signed.mp4", chain)
    anchors = directory / "anchors.pem"
    anchors.write_text(chain.root)
    return Sources(
        unsigned=unsigned,
        signed=signed,
        tampered=c2pa_media.tampered(signed, directory / "tampered.mp4"),
        malformed=c2pa_media.malformed(unsigned, directory / "malformed.mp4"),
        deeply_nested=c2pa_media.deeply_nested(unsigned, directory / "nested.mp4"),
        oversized=c2pa_media.oversized(unsigned, directory / "oversized.mp4"),
        anchors=anchors,
        chain=chain,
    )


async def inspect(
    path: Path, scratch: Path, *, required: bool = False, **provenance: object
) -> tuple[Verdict, list[RunResult]]:
    sandbox = Sandbox(MediaConfig(scratch_dir=str(scratch), decode_check="none"))
    reader = ProvenanceReader(sandbox, ProvenanceConfig(**provenance))  # type: ignore[arg-type]
    record: list[RunResult] = []
    verdict, _ = await inspect_file(
        sandbox, path, record=record, provenance=reader, require_provenance=required
    )
    assert not scratch.exists() or list(scratch.iterdir()) == []
    return verdict, record


async def test_a_provider_signed_source_is_trusted_with_its_root_and_says_ai_generated(
    sources: Sources, tmp_path: Path
) -> None:
    verdict, record = await inspect(
        sources.signed, tmp_path, trust_anchors_file=str(sources.anchors)
    )
    assert verdict.valid
    found = verdict.provenance
    assert found is not None
    assert (found.present, found.state, found.codes) == (True, "trusted", [])
    assert found.claim_generator == "example-video-provider 2026.12"
    assert (found.signer_subject, found.signer_issuer) == (
        "Example Video Provider",
        "aivedio development",
    )
    assert (found.digital_source_type, found.ai_generated) == ("trainedAlgorithmicMedia", True)
    assert found.actions == ["c2pa.created"]
    assert found.manifest_hash is not None and len(found.manifest_hash) == 64
    reader_runs = [r for r in record if r.tool == "c2pa"]
    assert len(reader_runs) == 1 and reader_runs[0].ok
    assert reader_runs[0].network_isolated == verdict.network_isolated


async def test_without_trust_anchors_the_same_source_is_untrusted_but_verified(
    sources: Sources, tmp_path: Path
) -> None:
    verdict, _ = await inspect(sources.signed, tmp_path)
    assert verdict.provenance is not None
    assert verdict.provenance.state == "untrusted"
    assert verdict.provenance.codes == ["signingCredential.untrusted"]
    assert verdict.provenance.verified


async def test_an_unsigned_source_is_absent(sources: Sources, tmp_path: Path) -> None:
    verdict, _ = await inspect(sources.unsigned, tmp_path)
    assert verdict.valid
    assert verdict.provenance is not None
    assert (verdict.provenance.present, verdict.provenance.state) == (False, "absent")


async def test_a_source_changed_after_signing_is_invalid_with_the_hash_mismatch(
    sources: Sources, tmp_path: Path
) -> None:
    verdict, _ = await inspect(sources.tampered, tmp_path, trust_anchors_file=str(sources.anchors))
    assert verdict.provenance is not None
    assert verdict.provenance.state == "invalid"
    assert "assertion.bmffHash.mismatch" in verdict.provenance.codes
    assert verdict.provenance.signer_subject == "Example Video Provider"


@pytest.mark.parametrize("kind", ["malformed", "deeply_nested", "oversized"])
async def test_a_hostile_store_is_refused_without_harm_and_the_media_still_judged(
    sources: Sources, tmp_path: Path, kind: str
) -> None:
    verdict, record = await inspect(getattr(sources, kind), tmp_path)
    assert verdict.valid  # the media itself is fine: only its store is hostile
    assert verdict.provenance is not None
    assert verdict.provenance.state == "invalid"
    assert verdict.provenance.codes == ["manifest.unreadable"]
    reader = next(r for r in record if r.tool == "c2pa")
    assert reader.ok and reader.wall_seconds < 10


async def test_a_reader_past_its_deadline_is_killed_and_recorded_unreadable(
    sources: Sources, tmp_path: Path
) -> None:
    verdict, record = await inspect(sources.signed, tmp_path, reader_timeout_seconds=0.001)
    assert verdict.valid
    assert verdict.provenance is not None
    assert (verdict.provenance.state, verdict.provenance.codes) == ("invalid", ["reader.timeout"])
    assert next(r for r in record if r.tool == "c2pa").timed_out


async def test_a_reader_out_of_memory_is_recorded_unreadable_not_raised(
    sources: Sources, tmp_path: Path
) -> None:
    # 32 MiB of address space: the interpreter with c2pa-rs loaded does not fit.
    verdict, _ = await inspect(sources.signed, tmp_path, reader_address_space_mib=32)
    assert verdict.valid
    assert verdict.provenance is not None
    assert verdict.provenance.state == "invalid"
    assert verdict.provenance.codes[0].startswith("reader.")


@pytest.mark.parametrize(
    ("name", "reason"),
    [("unsigned", "provenance_missing"), ("tampered", "provenance_invalid"), ("signed", None)],
)
async def test_required_provenance_makes_a_missing_or_invalid_one_invalid_media(
    sources: Sources, tmp_path: Path, name: str, reason: str | None
) -> None:
    verdict, _ = await inspect(getattr(sources, name), tmp_path, required=True)
    if reason is None:
        assert verdict.valid
    else:
        assert (verdict.verdict, verdict.error_class, verdict.reasons) == (
            "invalid",
            "invalid_media",
            [reason],
        )
        assert verdict.provenance is not None and verdict.media is not None
