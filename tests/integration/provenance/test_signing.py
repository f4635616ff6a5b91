"""The platform's C2PA signing of what it publishes, with real c2pa-python and ffmpeg: a
media run (``MediaRun``) over provider-signed and unsigned sources, each output re-read and
re-verified with c2pa-python's ``Reader`` as a viewer would."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import c2pa
import pytest

from aivedio.config.media import MediaConfig, RungConfig
from aivedio.config.provenance import ProvenanceConfig
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import Report
from aivedio.pipeline.ffmpeg.provenance_read import ProvenanceReader
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.media.signing import Signing
from aivedio.provenance.signing import C2paSigner
from aivedio.provenance.throwaway import SigningChain, make_chain
from tests.support import c2pa_media
from tests.support import media_fixtures as mf

SMALL = MediaConfig(
    ladder=[RungConfig(height=240), RungConfig(height=180)],
    segment_seconds=1,
    proxy_height=180,
    decode_check="none",
)
SIGNED_OUTPUTS = {"playback": "video/mp4", "proxy": "video/mp4", "poster": "image/jpeg"}


@dataclass(frozen=True)
class Chains:
    provider: SigningChain
    platform: SigningChain
    anchors: str  # both roots


@pytest.fixture(scope="module")
def chains() -> Chains:
    provider, platform = make_chain("Example Video Provider"), make_chain("aivedio platform")
    return Chains(provider, platform, provider.root + platform.root)


@dataclass
class Made:
    report: Report
    out: Path


def run_media(
    source: Path,
    root: Path,
    chains: Chains,
    *,
    wants: list[str] | None = None,
    callback: Callable[[bytes], bytes] | None = None,
    publish_unsigned: bool = False,
) -> Made:
    config = ProvenanceConfig()
    signer = C2paSigner(
        config,
        chain_pem=chains.platform.chain,
        key_pem=None if callback else chains.platform.key,
        callback=callback,
        trust_anchors_pem=chains.anchors,
    )

    async def main() -> Report:
        sandbox = Sandbox(SMALL)
        run = MediaRun(sandbox, source, root)
        run.provenance_reader = ProvenanceReader(sandbox, config)
        run.signing = Signing(
            signer=signer, outputs=frozenset(SIGNED_OUTPUTS), publish_unsigned=publish_unsigned
        )
        return await run.run(wants=wants or ["playback", "poster", "proxy", "keyframes", "hls"])

    report = anyio.run(main)
    return Made(report, root / "out")


def read(path: Path, mime: str, anchors: str) -> dict[str, Any]:
    settings = {"verify": {"remote_manifest_fetch": False}, "trust": {"trust_anchors": anchors}}
    with (
        c2pa.Context.from_dict(settings) as context,
        path.open("rb") as handle,
        c2pa.Reader(mime, handle, None, context) as reader,
    ):
        store: dict[str, Any] = json.loads(reader.json())
    return store


def active(store: dict[str, Any]) -> dict[str, Any]:
    manifest: dict[str, Any] = store["manifests"][store["active_manifest"]]
    return manifest


def actions(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    found = [a for a in manifest["assertions"] if a["label"].startswith("c2pa.actions")]
    return list(found[0]["data"]["actions"])


@dataclass(frozen=True)
class Sources:
    remux: Path
    transcode: Path
    unsigned: Path


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, chains: Chains) -> Sources:
    directory = tmp_path_factory.mktemp("sources")
    unsigned = mf.h264_faststart(directory, seconds=2)
    yuv444 = mf.yuv444p_mp4(directory)  # transcoded: its pixel format
    return Sources(
        remux=c2pa_media.provider_signed(unsigned, directory / "remux.mp4", chains.provider),
        transcode=c2pa_media.provider_signed(yuv444, directory / "444.mp4", chains.provider),
        unsigned=unsigned,
    )


@pytest.fixture(scope="module")
def remuxed(sources: Sources, chains: Chains, tmp_path_factory: pytest.TempPathFactory) -> Made:
    return run_media(sources.remux, tmp_path_factory.mktemp("remux"), chains)


@pytest.fixture(scope="module")
def transcoded(sources: Sources, chains: Chains, tmp_path_factory: pytest.TempPathFactory) -> Made:
    return run_media(sources.transcode, tmp_path_factory.mktemp("transcode"), chains)


@pytest.mark.parametrize("path", ["remuxed", "transcoded"])
def test_a_signed_source_keeps_its_manifest_as_the_parent_ingredient(
    path: str, request: pytest.FixtureRequest, chains: Chains
) -> None:
    made: Made = request.getfixturevalue(path)
    assert made.report.verdict.provenance is not None
    assert made.report.verdict.provenance.present
    expected = "c2pa.repackaged" if path == "remuxed" else "c2pa.transcoded"
    assert made.report.plan is not None
    assert made.report.plan.mode == ("remux" if path == "remuxed" else "transcode")
    for output, mime in SIGNED_OUTPUTS.items():
        store = read(made.out / made.report.outputs[output].primary, mime, chains.anchors)
        assert store["validation_state"] == "Trusted", (output, store.get("validation_results"))
        manifest = active(store)
        assert manifest["signature_info"]["common_name"] == "aivedio platform"
        [parent] = manifest["ingredients"]
        assert parent["relationship"] == "parentOf"
        source_manifest = store["manifests"][parent["active_manifest"]]
        assert source_manifest["signature_info"]["common_name"] == "Example Video Provider"
        assert actions(source_manifest)[0]["action"] == "c2pa.created"
        done = actions(manifest)
        assert done[0]["action"] == "c2pa.opened"
        ours = done[1:]
        if output == "playback":
            assert ours[0]["action"] == expected
        for action in ours:
            assert action["softwareAgent"]["name"] == "aivedio"
            assert action["digitalSourceType"].endswith("/trainedAlgorithmicMedia")
        record = made.report.outputs[output]
        assert record.c2pa is not None and record.c2pa.signed and record.c2pa.parent_manifest
        assert record.c2pa.manifest_label == manifest["label"]


def test_the_recorded_sha256_is_the_signed_files(remuxed: Made) -> None:
    for output in SIGNED_OUTPUTS:
        record = remuxed.report.outputs[output]
        file = record.primary_file()
        data = (remuxed.out / file.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == file.sha256
        assert len(data) == file.size


def test_a_signed_mp4_still_plays_from_the_start(remuxed: Made) -> None:
    boxes = mf.top_level_boxes(remuxed.out / "playback.mp4")
    assert boxes.index("uuid") < boxes.index("moov") < boxes.index("mdat")
    assert mf.decode(remuxed.out / "playback.mp4", xerror=True).returncode == 0
    # the keyframe index was made from the signed playback MP4
    assert remuxed.report.nodes["keyframes"].status == "done"


def test_an_unsigned_source_gets_a_platform_manifest_with_no_parent_manifest(
    sources: Sources, chains: Chains, tmp_path: Path
) -> None:
    made = run_media(sources.unsigned, tmp_path, chains, wants=["playback"])
    store = read(made.out / "playback.mp4", "video/mp4", chains.anchors)
    assert store["validation_state"] == "Trusted"
    assert len(store["manifests"]) == 1
    [parent] = active(store)["ingredients"]
    assert parent["relationship"] == "parentOf"
    assert "active_manifest" not in parent
    record = made.report.outputs["playback"]
    assert record.c2pa is not None and record.c2pa.signed and not record.c2pa.parent_manifest
    assert "digitalSourceType" not in actions(active(store))[1]


def test_a_failed_signing_fails_the_output(
    sources: Sources, chains: Chains, tmp_path: Path
) -> None:
    made = run_media(sources.unsigned, tmp_path, chains, wants=["playback"], callback=lambda _: b"")
    node = made.report.nodes["playback"]
    assert (node.status, node.error_class) == ("failed", "signing_failed")
    assert not made.report.required_done


def test_a_failed_signing_may_publish_unsigned_with_its_reason(
    sources: Sources, chains: Chains, tmp_path: Path
) -> None:
    made = run_media(
        sources.unsigned,
        tmp_path,
        chains,
        wants=["playback"],
        callback=lambda _: b"",
        publish_unsigned=True,
    )
    record = made.report.outputs["playback"]
    assert record.c2pa is not None and not record.c2pa.signed
    assert record.c2pa.unsigned_reason and "signing failed" in record.c2pa.unsigned_reason
    assert mf.top_level_boxes(made.out / "playback.mp4").count("uuid") == 0


def test_a_hostile_source_store_is_never_parsed_by_the_signer(
    sources: Sources, chains: Chains, tmp_path: Path
) -> None:
    hostile = c2pa_media.malformed(sources.unsigned, tmp_path / "hostile.mp4")
    made = run_media(hostile, tmp_path / "run", chains, wants=["playback"])
    assert made.report.verdict.provenance is not None
    assert made.report.verdict.provenance.codes == ["manifest.unreadable"]
    store = read(made.out / "playback.mp4", "video/mp4", chains.anchors)
    assert store["validation_state"] == "Trusted"
    [parent] = active(store)["ingredients"]
    assert "could not be read" in parent.get("description", "")
    assert len(store["manifests"]) == 1


def test_the_hls_set_names_its_provenance_record_binding_every_file(remuxed: Made) -> None:
    hls = remuxed.out / "hls"
    master = (hls / "master.m3u8").read_text()
    assert '#EXT-X-SESSION-DATA:DATA-ID="org.aivedio.provenance",URI="provenance.json"' in master
    record = json.loads((hls / "provenance.json").read_text())
    assert record["segments_signed"] is False
    assert record["signed_reference"]["path"] == "../playback.mp4"
    assert record["source"]["signer_subject"] == "Example Video Provider"
    listed = {f["path"]: f["sha256"] for f in record["files"]}
    made = {f.path.removeprefix("hls/"): f.sha256 for f in remuxed.report.outputs["hls"].files}
    assert listed and all(made[path] == digest for path, digest in listed.items())
    assert "provenance.json" in made  # uploaded and checked with the set
    assert any(path.endswith(".m4s") for path in listed)
