"""The source's C2PA manifest store, read by c2pa-rs in the sandbox like ffprobe.

The reader is a parser of untrusted input (JUMBF, CBOR, COSE, X.509), so it never runs in
the worker: ``Sandbox.run("c2pa", …)`` starts ``aivedio.provenance.read_child`` with its
own rlimits (``[provenance] reader_address_space_mib``, ``reader_cpu_seconds``), in a
network namespace where the platform allows, with ``reader_timeout_seconds`` then SIGKILL.
Whatever goes wrong there is a verdict on the store, never an error of the job: a crash, a
deadline, a limit or output we cannot decode records the store as ``invalid`` with a
``reader.*`` code, and the pipeline goes on (a provider's ``require_provenance`` decides
whether that blocks publication).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from aivedio.config.provenance import ProvenanceConfig
from aivedio.logs import get_logger
from aivedio.pipeline.ffmpeg.sandbox import Limits, RunResult, Sandbox
from aivedio.pipeline.media.provenance import STATES, Provenance, text, unreadable

log = get_logger("aivedio.provenance")

# The container kinds the sniffer names, as the reader's format hint.
MIME_OF_KIND = {"mp4": "video/mp4", "mov": "video/quicktime"}
MAX_SUMMARY_BYTES = 256 * 1024


class ProvenanceReader:
    """Reads one file's manifest store in the sandbox; one per process is enough."""

    def __init__(self, sandbox: Sandbox, config: ProvenanceConfig) -> None:
        self.sandbox = sandbox
        self.config = config
        media = sandbox.limits
        self.limits = Limits(
            address_space_bytes=config.reader_address_space_mib * 1024**2,
            cpu_seconds=config.reader_cpu_seconds,
            file_size_bytes=min(media.file_size_bytes, 16 * 1024**2),
            open_files=min(media.open_files, 64),
            processes=media.processes,
        )

    def args(self, path: Path, kind: str | None) -> list[str]:
        args: list[str] = []
        mime = MIME_OF_KIND.get(kind or "")
        if mime:
            args += ["--format", mime]
        if self.config.trust_anchors_file:
            args += ["--trust-anchors", str(Path(self.config.trust_anchors_file).resolve())]
        return [*args, str(path.resolve())]

    async def read(
        self, path: Path, *, kind: str | None, cwd: Path, record: list[RunResult] | None = None
    ) -> Provenance:
        result = await self.sandbox.run(
            "c2pa",
            self.args(path, kind),
            cwd=cwd,
            deadline_seconds=self.config.reader_timeout_seconds,
            capture_stdout=True,
            record=record,
            limits=self.limits,
        )
        summary = verdict_of(result)
        if summary.codes and summary.codes[0].startswith("reader."):
            log.warning(
                "provenance_reader_failed",
                code=summary.codes[0],
                detail=result.error_detail()[:300],
            )
        return summary


def verdict_of(result: RunResult) -> Provenance:
    """The reader's summary, or the store recorded unreadable with why the reader stopped."""
    if result.timed_out:
        return unreadable("reader.timeout", "the C2PA reader ran past its deadline")
    if result.crashed:
        return unreadable("reader.crashed", f"the C2PA reader crashed ({-result.returncode})")
    if not result.ok:
        code = "reader.exhausted" if result.exhausted else "reader.failed"
        return unreadable(code, result.error_detail(limit=2))
    if len(result.stdout) > MAX_SUMMARY_BYTES:
        return unreadable("reader.failed", "the C2PA reader's answer is too large")
    try:
        summary = msgspec.json.decode(result.stdout, type=Provenance)
    except msgspec.DecodeError as exc:
        return unreadable("reader.failed", f"the C2PA reader's answer did not decode: {exc}")
    return _bounded(summary)


def _bounded(summary: Provenance) -> Provenance:
    """The child's summary is already cleaned; cleaned again here (it ran on hostile input:
    a compromised child could write anything that decodes)."""

    def many(values: list[str]) -> list[str]:
        return [v for v in (text(x) for x in values[:32]) if v]

    return msgspec.structs.replace(
        summary,
        state=summary.state if summary.state in STATES else "invalid",
        codes=many(summary.codes),
        claim_generator=text(summary.claim_generator),
        signer_subject=text(summary.signer_subject),
        signer_issuer=text(summary.signer_issuer),
        digital_source_type=text(summary.digital_source_type),
        actions=many(summary.actions),
        manifest_label=text(summary.manifest_label),
        manifest_hash=text(summary.manifest_hash),
        detail=text(summary.detail),
    )
