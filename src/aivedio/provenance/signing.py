"""The platform's C2PA signer (``OutputSigner``) on c2pa-python's ``Builder``.

Each output gets a manifest with the edit intent: the source is its ``parentOf`` ingredient,
carrying the source's manifest store when it had one, and the actions say what we did
(``actions_for``: repackaged or transcoded, resized), each with ``softwareAgent`` aivedio
and its version and the source's ``digitalSourceType`` kept. No user data is added; the
operator's own assertions are (``[provenance] assertions``).

The source's store is parsed again here, in the worker, as the ingredient is made. That is
safe only because the sandboxed reader parsed the same bytes first and came back with a
summary: a store the reader could not read (``reader.*``, ``manifest.unreadable``) is never
handed to c2pa-rs here; the ingredient is then a copy of the source without its store, and
says so. A source the signer cannot take as an ingredient at all (a container c2pa does
not know, WebM or Matroska) leaves its outputs unsigned, with that reason: a manifest
without its parent would claim the platform created the picture.

c2pa-python is synchronous: a signing runs in a worker thread, with a signer and a context
of its own (both cheap to make), so signings never share a native object.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import c2pa
from cryptography import x509
from cryptography.x509.oid import NameOID

from aivedio import __version__
from aivedio.config.provenance import ProvenanceConfig
from aivedio.errors import ConfigError, SigningError
from aivedio.logs import get_logger
from aivedio.pipeline.media import c2pa_boxes as bmff
from aivedio.pipeline.media.provenance import text
from aivedio.pipeline.media.signing import Signed, Signing, SignRequest

log = get_logger("aivedio.provenance")

IPTC_SOURCE_TYPES = "http://cv.iptc.org/newscodes/digitalsourcetype/"
INGREDIENT_FORMATS = frozenset({"video/mp4", "video/quicktime"})
ALGORITHMS = {
    "es256": c2pa.C2paSigningAlg.ES256,
    "es384": c2pa.C2paSigningAlg.ES384,
    "es512": c2pa.C2paSigningAlg.ES512,
    "ps256": c2pa.C2paSigningAlg.PS256,
    "ps384": c2pa.C2paSigningAlg.PS384,
    "ps512": c2pa.C2paSigningAlg.PS512,
    "ed25519": c2pa.C2paSigningAlg.ED25519,
}
SignCallback = Callable[[bytes], bytes]


class C2paSigner:
    """Signs outputs in place with the configured chain and key (or key callback)."""

    def __init__(
        self,
        config: ProvenanceConfig,
        *,
        chain_pem: str,
        key_pem: str | None = None,
        callback: SignCallback | None = None,
        trust_anchors_pem: str | None = None,
    ) -> None:
        if (key_pem is None) == (callback is None):
            raise ConfigError("a C2PA signer needs a private key or a signing callback")
        self.config = config
        self.chain_pem = chain_pem
        self._key_pem = key_pem
        self._callback = callback
        self._trust_anchors = trust_anchors_pem
        self.algorithm = ALGORITHMS[config.algorithm]
        self.subject = _subject(chain_pem)

    @classmethod
    def from_config(cls, config: ProvenanceConfig) -> C2paSigner | None:
        """The configured signer; None when ``[provenance]`` configures none."""
        if not config.signing:
            return None
        chain = _read(config.certificate_chain_file, "provenance.certificate_chain_file")
        key = _read(config.private_key_file, "provenance.private_key_file") or None
        callback = _callback(config.key_callback) if config.key_callback else None
        anchors = _read(config.trust_anchors_file, "provenance.trust_anchors_file") or None
        signer = cls(
            config, chain_pem=chain, key_pem=key, callback=callback, trust_anchors_pem=anchors
        )
        signer._native_signer().close()  # a chain or key c2pa refuses: refused at start
        return signer

    async def sign(self, request: SignRequest) -> Signed:
        return await anyio.to_thread.run_sync(self.sign_now, request)

    def sign_now(self, request: SignRequest) -> Signed:
        """``sign``, on this thread."""
        if request.source_path is not None and request.source_mime not in INGREDIENT_FORMATS:
            return Signed(signed=False, unsigned_reason="source_not_an_ingredient")
        target = Path(request.path)
        scratch = Path(tempfile.mkdtemp(prefix=".sign-", dir=target.parent))
        try:
            signed = scratch / target.name
            parent_manifest = self._build(request, scratch, signed)
            label = self._label(signed, request.mime)
            os.replace(signed, target)
        except c2pa.C2paError as exc:
            raise SigningError(f"{request.output}: C2PA signing failed: {exc}"[:500]) from None
        except OSError as exc:
            raise SigningError(f"{request.output}: C2PA signing failed: {exc}") from None
        finally:
            for leftover in scratch.iterdir():
                leftover.unlink()
            scratch.rmdir()
        return Signed(
            signed=True, manifest_label=label, signer=self.subject, parent_manifest=parent_manifest
        )

    def manifest(self, request: SignRequest) -> dict[str, Any]:
        """The platform's manifest definition for ``request`` (its assertions, no user data)."""
        agent = {"name": "aivedio", "version": __version__}
        source_type = request.source.digital_source_type if request.source else None
        actions: list[dict[str, Any]] = []
        for name in request.actions:
            action: dict[str, Any] = {"action": name, "softwareAgent": agent}
            if source_type:
                action["digitalSourceType"] = IPTC_SOURCE_TYPES + source_type
            actions.append(action)
        return {
            "claim_generator_info": [agent],
            "title": Path(request.path).name,
            "format": request.mime,
            "assertions": [
                {"label": "c2pa.actions", "data": {"actions": actions}},
                *self.config.assertions,
            ],
        }

    def _context(self) -> c2pa.Context:
        settings: dict[str, Any] = {
            "verify": {"remote_manifest_fetch": False, "ocsp_fetch": False},
            "builder": {"thumbnail": {"enabled": False}},
        }
        if self._trust_anchors:
            settings["trust"] = {"trust_anchors": self._trust_anchors}
        return c2pa.Context.from_dict(settings)

    def _native_signer(self) -> c2pa.Signer:
        tsa = self.config.timestamp_url or None
        if self._callback is not None:
            return c2pa.Signer.from_callback(self._callback, self.algorithm, self.chain_pem, tsa)
        assert self._key_pem is not None
        info = c2pa.C2paSignerInfo(
            self.algorithm, self.chain_pem.encode(), self._key_pem.encode(), tsa
        )
        return c2pa.Signer.from_info(info)

    def _build(self, request: SignRequest, scratch: Path, signed: Path) -> bool:
        """Sign ``request.path`` into ``signed``; whether the source's store was carried."""
        context = self._context()
        with context, self._native_signer() as signer:
            builder = c2pa.Builder(self.manifest(request), context)
            parent_manifest = False
            if request.source_path is not None:
                builder.set_intent(c2pa.C2paBuilderIntent.EDIT)
                parent_manifest = self._add_parent(builder, request, scratch)
            with open(request.path, "rb") as source, open(signed, "w+b") as out:
                builder.sign(signer, request.mime, source, out)
        return parent_manifest

    def _add_parent(self, builder: c2pa.Builder, request: SignRequest, scratch: Path) -> bool:
        assert request.source_path is not None and request.source_mime is not None
        path = Path(request.source_path)
        ingredient: dict[str, Any] = {"title": "source", "relationship": "parentOf"}
        source = request.source
        readable = source is not None and not (source.present and _unreadable(source.codes))
        if not readable:
            # Never parsed in the worker: the sandboxed reader did not vouch for it.
            stripped = scratch / "source-without-store"
            if bmff.without_store(path, stripped):
                path = stripped
            ingredient["description"] = "its C2PA manifest store could not be read"
        with open(path, "rb") as stream:
            builder.add_ingredient(ingredient, request.source_mime, stream)
        return readable and source is not None and source.present

    def _label(self, signed: Path, mime: str) -> str | None:
        """The platform manifest's label, read back from what was signed (our own file)."""
        with self._context() as context, open(signed, "rb") as handle:
            reader = c2pa.Reader(mime, handle, None, context)
            with reader:
                manifest = reader.get_active_manifest() or {}
        return text(manifest.get("label"))


def signing_from_config(config: ProvenanceConfig) -> Signing | None:
    """The media pipeline's signing from ``[provenance]``; None when no signer is
    configured. Raises ConfigError for a chain, key or callback that cannot be used."""
    signer = C2paSigner.from_config(config)
    if signer is None:
        return None
    return Signing(
        signer=signer,
        outputs=frozenset(config.signed_outputs),
        publish_unsigned=config.on_sign_failure == "publish_unsigned",
    )


def _unreadable(codes: list[str]) -> bool:
    return any(c.startswith("reader.") or c == "manifest.unreadable" for c in codes)


def _read(path: str, key: str) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config error: {key}: cannot read {path} ({exc})") from None


def _callback(spec: str) -> SignCallback:
    module_name, _, attribute = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"config error: provenance.key_callback: {spec}: {exc}") from None
    if not callable(found):
        raise ConfigError(f"config error: provenance.key_callback: {spec} is not callable")
    sign: SignCallback = found
    return sign


def _subject(chain_pem: str) -> str | None:
    """The end entity's common name (the chain's first certificate)."""
    try:
        leaf = x509.load_pem_x509_certificates(chain_pem.encode())[0]
    except (ValueError, IndexError):
        return None
    names = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else None
    return text(value) if isinstance(value, str) else None
