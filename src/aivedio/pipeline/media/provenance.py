"""What a C2PA manifest store says, in a few fields we record and show: pure, no I/O.

The store comes from c2pa-rs (``Reader.json()``) run over an untrusted file, so every string
taken from it is cut to a bounded length and stripped of control characters, and only the
fields below leave the reader: the claim generator, the signer's subject and issuer, the
``digitalSourceType`` (and whether it says AI-generated), the actions, the validation state
with its failure codes, and the store's own SHA-256 (``manifest_hash``). ``state`` is one of

* ``absent``: no manifest store;
* ``trusted``: valid, and the signer chains to a configured trust anchor;
* ``valid``: valid, trust not checked (no trust anchors configured and trust checks off);
* ``untrusted``: valid signature and hashes, the signer chains to no trust anchor;
* ``invalid``: a failure code other than an untrusted signer (tampered bytes, a broken
  signature, an unreadable or hostile store: ``codes`` says which).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

STATES = ("absent", "trusted", "valid", "untrusted", "invalid")
UNTRUSTED_CODES = frozenset({"signingCredential.untrusted"})
MAX_TEXT = 200
MAX_ITEMS = 32
# IPTC digital source types that say a trained model made the picture (C2PA's AI marking).
AI_SOURCE_TYPES = frozenset(
    {
        "trainedAlgorithmicMedia",
        "compositeWithTrainedAlgorithmicMedia",
        "trainedAlgorithmicData",
    }
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class Provenance(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The provenance of one file as recorded on its asset and shown by the API."""

    present: bool
    state: str
    codes: list[str] = []
    claim_generator: str | None = None
    signer_subject: str | None = None
    signer_issuer: str | None = None
    digital_source_type: str | None = None
    ai_generated: bool | None = None
    actions: list[str] = []
    manifest_label: str | None = None
    manifest_hash: str | None = None
    manifests: int = 0
    detail: str | None = None

    @property
    def verified(self) -> bool:
        """Signature and hashes check out (whoever the signer is)."""
        return self.state in ("trusted", "valid", "untrusted")


ABSENT = Provenance(present=False, state="absent")


def text(value: Any) -> str | None:
    """An untrusted string, bounded and without control characters; None if not a string."""
    if not isinstance(value, str):
        return None
    cleaned = _CONTROL.sub("", value).strip()
    return cleaned[:MAX_TEXT] or None


def unreadable(code: str, detail: str = "") -> Provenance:
    """A store that is there but could not be read (hostile, malformed, or the reader
    crashed or ran out of time on it): invalid, with ``code``."""
    return Provenance(present=True, state="invalid", codes=[code], detail=text(detail))


def source_type_name(uri: Any) -> str | None:
    """``http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia`` →
    ``trainedAlgorithmicMedia`` (the last path segment, as IPTC and C2PA name them)."""
    value = text(uri)
    if value is None:
        return None
    return value.rstrip("/").rsplit("/", 1)[-1] or None


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value[:MAX_ITEMS] if isinstance(value, list) else []


def _actions(manifest: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found: list[Mapping[str, Any]] = []
    for assertion in _list(manifest.get("assertions")):
        label = text(_dict(assertion).get("label")) or ""
        if label == "c2pa.actions" or label.startswith("c2pa.actions."):
            found += [_dict(a) for a in _list(_dict(_dict(assertion).get("data")).get("actions"))]
    return found[:MAX_ITEMS]


def _claim_generator(manifest: Mapping[str, Any]) -> str | None:
    infos = _list(manifest.get("claim_generator_info"))
    if infos:
        info = _dict(infos[0])
        name, version = text(info.get("name")), text(info.get("version"))
        if name:
            return text(f"{name} {version}" if version else name)
    return text(manifest.get("claim_generator"))


def _source_type(store: Mapping[str, Any], label: Any, depth: int = 0) -> str | None:
    """The first ``digitalSourceType`` of the manifest ``label``'s actions, else of its
    parent ingredient's manifest (an edit keeps what its parent was), a few levels deep."""
    manifests = _dict(store.get("manifests"))
    manifest = _dict(manifests.get(label)) if isinstance(label, str) else {}
    for action in _actions(manifest):
        found = source_type_name(action.get("digitalSourceType"))
        if found:
            return found
    if depth >= 8:
        return None
    for ingredient in _list(manifest.get("ingredients")):
        ingredient = _dict(ingredient)
        if ingredient.get("relationship") == "parentOf":
            return _source_type(store, ingredient.get("active_manifest"), depth + 1)
    return None


def _failures(store: Mapping[str, Any]) -> list[str]:
    results = _dict(_dict(store.get("validation_results")).get("activeManifest"))
    entries = _list(results.get("failure")) if results else _list(store.get("validation_status"))
    codes = [text(_dict(e).get("code")) for e in entries]
    return sorted({c for c in codes if c})


def summarize(store: Mapping[str, Any], manifest_hash: str | None = None) -> Provenance:
    """The summary of a manifest store as ``Reader.json()`` gives it (decoded)."""
    label = store.get("active_manifest")
    manifests = _dict(store.get("manifests"))
    manifest = _dict(manifests.get(label)) if isinstance(label, str) else {}
    if not manifest:
        return unreadable("manifest.activeManifestMissing", "no active manifest in the store")
    codes = _failures(store)
    reported = text(store.get("validation_state")) or ""
    if reported == "Invalid" or set(codes) - UNTRUSTED_CODES:
        state = "invalid"
    elif codes:
        state = "untrusted"
    elif reported == "Trusted":
        state = "trusted"
    else:
        state = "valid"
    signature = _dict(manifest.get("signature_info"))
    source_type = _source_type(store, label)
    return Provenance(
        present=True,
        state=state,
        codes=codes,
        claim_generator=_claim_generator(manifest),
        signer_subject=text(signature.get("common_name")),
        signer_issuer=text(signature.get("issuer")),
        digital_source_type=source_type,
        ai_generated=(source_type in AI_SOURCE_TYPES) if source_type else None,
        actions=[a for a in (text(x.get("action")) for x in _actions(manifest)) if a],
        manifest_label=text(label),
        manifest_hash=manifest_hash,
        manifests=len(manifests),
    )
