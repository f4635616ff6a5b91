"""Provenance through a worker: real PostgreSQL, the local object store, real ffmpeg and real
c2pa-python. A provider-signed source is recorded with its manifest at the probe, published
with every signed output re-verifiable, and announced with its Content Credentials; a
provider that requires provenance turns an unsigned source into INVALID_MEDIA."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import c2pa
import msgspec
import pytest

from aivedio.cli.status import credentials_text
from aivedio.config.load import Config, ProviderConfig
from aivedio.config.provenance import ProvenanceConfig
from aivedio.pipeline.media.signing import Signing
from aivedio.provenance.signing import C2paSigner
from aivedio.provenance.throwaway import SigningChain, make_chain
from aivedio.store.asset_status import asset_status
from aivedio.store.database import Pool
from tests.support import c2pa_media
from tests.support import media_fixtures as mf
from tests.support.pipeline_rig import Rig, make_rig, running_worker

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def provider_chain() -> SigningChain:
    return make_chain("Example Video Provider")


@pytest.fixture(scope="module")
def platform_chain() -> SigningChain:
    return make_chain("aivedio platform")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, provider_chain: SigningChain) -> Path:
    directory = tmp_path_factory.mktemp("media")
    unsigned = mf.h264_faststart(directory, seconds=2)
    c2pa_media.provider_signed(unsigned, directory / "signed.mp4", provider_chain)
    return directory


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    required = ProviderConfig(require_provenance=True)
    config = msgspec.structs.replace(config, providers={**config.providers, "strict": required})
    async with make_rig(config, pool, tmp_path) as r:
        yield r


def signing(platform: SigningChain, provider: SigningChain) -> Signing:
    signer = C2paSigner(
        ProvenanceConfig(),
        chain_pem=platform.chain,
        key_pem=platform.key,
        trust_anchors_pem=provider.root,
    )
    return Signing(signer=signer, outputs=frozenset({"playback", "proxy", "poster"}))


def verify(body: bytes, mime: str, anchors: str) -> dict[str, Any]:
    settings = {"verify": {"remote_manifest_fetch": False}, "trust": {"trust_anchors": anchors}}
    with (
        c2pa.Context.from_dict(settings) as context,
        c2pa.Reader(mime, io.BytesIO(body), None, context) as reader,
    ):
        store: dict[str, Any] = json.loads(reader.json())
    return store


async def test_a_signed_source_is_recorded_published_signed_and_announced(
    rig: Rig, sources: Path, provider_chain: SigningChain, platform_chain: SigningChain
) -> None:
    asset_id = await rig.quarantine(
        (sources / "signed.mp4").read_bytes(), task=("veo", "task-signed")
    )
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig, signing=signing(platform_chain, provider_chain)):
        await rig.wait("SELECT 1 FROM assets WHERE status = 'ENRICHED'")
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["provenance_state"] == "untrusted"  # no trust anchors configured here
    recorded = asset["provenance"]
    assert recorded["signer_subject"] == "Example Video Provider"
    assert recorded["digital_source_type"] == "trainedAlgorithmicMedia"
    assert recorded["ai_generated"] is True and recorded["actions"] == ["c2pa.created"]
    variants = await rig.variants(asset_id)
    anchors = provider_chain.root + platform_chain.root
    for name, mime in (("playback", "video/mp4"), ("proxy", "video/mp4"), ("poster", "image/jpeg")):
        variant = variants[name]
        assert variant["extra"]["c2pa"]["signed"] is True, name
        body = await rig.store.get_bytes(variant["object_key"])
        assert hashlib.sha256(body).hexdigest() == variant["checksum"]  # the signed bytes
        store = verify(body, mime, anchors)
        assert store["validation_state"] == "Trusted", name
        manifest = store["manifests"][store["active_manifest"]]
        assert manifest["label"] == variant["extra"]["c2pa"]["manifest_label"]
        [parent] = manifest["ingredients"]
        assert parent["active_manifest"] == recorded["manifest_label"]
    ready = [e for e in await rig.events(asset_id) if e["event_type"] == "asset.ready"]
    credentials = ready[0]["payload"]["content_credentials"]
    assert credentials["ai_generated"] is True and credentials["source_verified"] is True
    assert credentials["platform_signed"] is True
    assert credentials["platform_signer"] == "aivedio platform"
    assert credentials["source"]["signer_subject"] == "Example Video Provider"
    status = await asset_status(rig.pool, asset_id)
    assert status is not None
    line = credentials_text(status)
    assert line is not None
    assert "source untrusted" in line and "AI-generated (trainedAlgorithmicMedia)" in line
    assert "signed by aivedio platform" in line


async def test_a_provider_requiring_provenance_refuses_an_unsigned_source(
    rig: Rig, sources: Path
) -> None:
    unsigned = next(p for p in sources.iterdir() if p.name != "signed.mp4")
    asset_id = await rig.quarantine(unsigned.read_bytes(), task=("strict", "task-unsigned"))
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "INVALID_MEDIA"
    assert asset["probe"]["reasons"] == ["provenance_missing"]
    assert asset["provenance_state"] == "absent"
    invalid = [e for e in await rig.events(asset_id) if e["event_type"] == "asset.invalid"]
    assert invalid[0]["payload"]["reasons"] == ["provenance_missing"]
