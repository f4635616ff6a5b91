"""The manifest store's summary (``summarize``), the platform's actions (``actions_for``)
and the Content Credentials made from both: pure, on stores shaped as c2pa-rs writes them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from aivedio.pipeline.media.credentials import content_credentials
from aivedio.pipeline.media.provenance import MAX_TEXT, summarize, text
from aivedio.pipeline.media.signing import actions_for

TRAINED = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"


def store(
    *,
    state: str = "Valid",
    failures: list[str] | None = None,
    actions: list[dict[str, Any]] | None = None,
    parent: dict[str, Any] | None = None,
) -> dict[str, Any]:
    manifests: dict[str, Any] = {
        "urn:c2pa:active": {
            "claim_generator_info": [{"name": "example-provider", "version": "1.0"}],
            "signature_info": {"common_name": "Example Video Provider", "issuer": "Example CA"},
            "assertions": [
                {
                    "label": "c2pa.actions.v2",
                    "data": {
                        "actions": actions
                        if actions is not None
                        else [{"action": "c2pa.created", "digitalSourceType": TRAINED}]
                    },
                }
            ],
            "ingredients": [],
        }
    }
    if parent is not None:
        manifests["urn:c2pa:active"]["ingredients"] = [
            {"relationship": "parentOf", "active_manifest": "urn:c2pa:parent"}
        ]
        manifests["urn:c2pa:parent"] = parent
    return {
        "active_manifest": "urn:c2pa:active",
        "manifests": manifests,
        "validation_state": state,
        "validation_results": {
            "activeManifest": {"failure": [{"code": c} for c in failures or []]}
        },
    }


def test_a_trusted_store_is_summarized_with_its_signer_and_ai_marking() -> None:
    found = summarize(store(state="Trusted"), manifest_hash="ab" * 32)
    assert (found.present, found.state, found.codes) == (True, "trusted", [])
    assert found.claim_generator == "example-provider 1.0"
    assert (found.signer_subject, found.signer_issuer) == ("Example Video Provider", "Example CA")
    assert (found.digital_source_type, found.ai_generated) == ("trainedAlgorithmicMedia", True)
    assert found.actions == ["c2pa.created"] and found.manifests == 1
    assert found.verified


@pytest.mark.parametrize(
    ("state", "failures", "expected"),
    [
        ("Valid", [], "valid"),
        ("Valid", ["signingCredential.untrusted"], "untrusted"),
        ("Invalid", ["assertion.bmffHash.mismatch"], "invalid"),
        ("Valid", ["signingCredential.untrusted", "claimSignature.mismatch"], "invalid"),
    ],
)
def test_the_state_follows_the_failure_codes(
    state: str, failures: list[str], expected: str
) -> None:
    found = summarize(store(state=state, failures=failures))
    assert found.state == expected
    assert found.codes == sorted(failures)
    assert found.verified == (expected != "invalid")


def test_an_edit_without_a_source_type_takes_its_parents() -> None:
    parent = store(actions=[{"action": "c2pa.created", "digitalSourceType": TRAINED}])
    edit = store(actions=[{"action": "c2pa.opened"}], parent=parent["manifests"]["urn:c2pa:active"])
    found = summarize(edit)
    assert found.actions == ["c2pa.opened"]
    assert found.digital_source_type == "trainedAlgorithmicMedia"


def test_a_store_without_its_active_manifest_is_invalid() -> None:
    found = summarize({"active_manifest": "urn:c2pa:gone", "manifests": {}})
    assert (found.state, found.codes) == ("invalid", ["manifest.activeManifestMissing"])


def test_untrusted_text_is_bounded_and_without_control_characters() -> None:
    hostile = store()
    hostile["manifests"]["urn:c2pa:active"]["signature_info"]["common_name"] = (
        "Evil\x1b[31m\u0085 Corp" + "x" * 1000
    )
    hostile["manifests"]["urn:c2pa:active"]["signature_info"]["issuer"] = {"not": "a string"}
    found = summarize(hostile)
    assert found.signer_subject is not None
    assert found.signer_subject.startswith("Evil[31m Corp")
    assert len(found.signer_subject) == MAX_TEXT
    assert found.signer_issuer is None
    assert text("\x00\x01") is None


@pytest.mark.parametrize(
    ("output", "copied", "resized", "expected"),
    [
        ("playback", True, False, ["c2pa.repackaged"]),
        ("playback", False, True, ["c2pa.transcoded", "c2pa.resized"]),
        ("proxy", False, False, ["c2pa.transcoded"]),
        ("poster", True, False, ["c2pa.transcoded"]),  # a frame, encoded again
    ],
)
def test_the_platform_says_what_it_did(
    output: str, copied: bool, resized: bool, expected: list[str]
) -> None:
    assert actions_for(output, copied=copied, resized=resized) == expected


def test_content_credentials_join_the_source_and_the_platforms_signing() -> None:
    source = msgspec.to_builtins(summarize(store(failures=["signingCredential.untrusted"])))
    signed = {"signed": True, "signer": "aivedio platform", "parent_manifest": True}
    found = content_credentials(source, {"playback": signed, "poster": signed, "hls": None})
    assert found is not None
    assert (found.ai_generated, found.source_verified, found.platform_signed) == (True, True, True)
    assert found.platform_signer == "aivedio platform"
    assert sorted(found.outputs) == ["playback", "poster"]
    unsigned = {"signed": False, "unsigned_reason": "signing failed"}
    partly = content_credentials(source, {"playback": signed, "poster": unsigned})
    assert partly is not None and not partly.platform_signed
    assert content_credentials(None, {"playback": None}) is None
    absent = content_credentials({"present": False, "state": "absent"}, {})
    assert absent is not None and absent.source_verified is None and absent.ai_generated is None
