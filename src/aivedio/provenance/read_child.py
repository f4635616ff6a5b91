"""The C2PA reader's child process: ``python -I -m aivedio.provenance.read_child FILE``.

c2pa-rs parses the manifest store (JUMBF, CBOR, COSE, X.509) of a file we did not make. It
runs here, in a process of its own that the sandbox starts under rlimits, in a network
namespace, with a deadline (``pipeline/ffmpeg/provenance_read.py``), never in the worker: a
crash, a runaway allocation or a hang costs this process, and the worker records the store
as unreadable. What leaves is the small ``Provenance`` summary as JSON on stdout (the parent
decodes it into bounded types); remote manifests and OCSP are never fetched.

Arguments: ``[--format MIME] [--trust-anchors PEM_FILE] FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from aivedio.pipeline.media.c2pa_boxes import store_hash
from aivedio.pipeline.media.provenance import ABSENT, Provenance, summarize, text, unreadable


def read(path: Path, mime: str | None, trust_anchors: str | None) -> Provenance:
    import c2pa  # the native library: loaded in this child only

    settings: dict[str, Any] = {
        "verify": {"remote_manifest_fetch": False, "ocsp_fetch": False},
    }
    if trust_anchors:
        settings["trust"] = {"trust_anchors": trust_anchors}
    context = c2pa.Context.from_dict(settings)
    with path.open("rb") as handle:
        try:
            reader = c2pa.Reader.try_create(mime, handle, None, context)
        except c2pa.C2paError.NotSupported as exc:
            return msgspec.structs.replace(ABSENT, detail=text(f"format not supported: {exc}"))
        except c2pa.C2paError as exc:
            return unreadable("manifest.unreadable", f"{type(exc).__name__}: {exc}")
        if reader is None:
            return ABSENT
        with reader:
            try:
                store = json.loads(reader.json())
            except (c2pa.C2paError, ValueError, RecursionError) as exc:
                return unreadable("manifest.unreadable", f"{type(exc).__name__}: {exc}")
    if not isinstance(store, dict):
        return unreadable("manifest.unreadable", "the store is not a JSON object")
    return summarize(store, manifest_hash=store_hash(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aivedio.provenance.read_child")
    parser.add_argument("--format", default=None)
    parser.add_argument("--trust-anchors", default=None)
    parser.add_argument("file")
    args = parser.parse_args(argv)
    anchors = Path(args.trust_anchors).read_text() if args.trust_anchors else None
    summary = read(Path(args.file), args.format, anchors)
    sys.stdout.buffer.write(msgspec.json.encode(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
