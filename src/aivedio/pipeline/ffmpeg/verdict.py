"""The whole verdict on one file: sniff, probe, validate, decode check.

``inspect_file`` is what the probe job and ``aivedio probe`` both run. Beside the probe, the
source's C2PA manifest store is read in the sandbox (``provenance_read``) and its summary
joins the verdict; it makes the verdict invalid (``provenance_missing``,
``provenance_invalid``) only when the provider requires provenance. Deterministic
failures raise nothing here: they come back as an ``invalid`` verdict with reason codes
(never retried); running out of time or memory raises ``ResourceExhaustedError`` (its own
class, retried a few times); a broken installation raises ``ConfigError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec

from aivedio.config.media import MediaConfig, ToleranceConfig
from aivedio.errors import InvalidMediaError
from aivedio.pipeline.ffmpeg.probe import (
    ProbeOutput,
    first_frame_side_data,
    raise_decode_failed,
    run_ffprobe,
)
from aivedio.pipeline.ffmpeg.provenance_read import ProvenanceReader
from aivedio.pipeline.ffmpeg.sandbox import RunResult, Sandbox, media_deadline
from aivedio.pipeline.media import colour
from aivedio.pipeline.media.provenance import Provenance
from aivedio.pipeline.media.sniff import Sniff, input_args, sniff_file
from aivedio.pipeline.media.validate import Declared, MediaSummary, validate

# A valid verdict whose decode check is still to run (``inspect_file(decode=False)``).
DEFERRED = "deferred"


class Verdict(msgspec.Struct, kw_only=True, omit_defaults=False):
    verdict: str  # "valid" | "invalid"
    error_class: str | None
    reasons: list[str]
    container: str
    media: MediaSummary | None
    decode_check: str  # none | sampled | full | skipped | deferred (not yet run)
    network_isolated: bool | None
    detail: str | None = None
    # The source's C2PA manifest store (None: not read).
    provenance: Provenance | None = None

    @property
    def valid(self) -> bool:
        return self.verdict == "valid"


def decode_args(media: MediaConfig, sniff: Sniff, path: Path, summary: MediaSummary) -> list[str]:
    """ffmpeg arguments for the decode check: ``-xerror`` or a tail-corrupted file exits 0."""

    def source() -> list[str]:
        return input_args(sniff, path, max_streams=media.max_streams, max_pixels=media.max_pixels)

    # By absolute index: the stream validated is the stream decoded (a cover picture may
    # come first and be "v:0").
    video, audio = summary.video_stream_index, summary.audio_stream_index
    if media.decode_check == "full":
        full_maps = ["-map", f"0:{video}", *(["-map", f"0:{audio}"] if audio is not None else [])]
        return ["-xerror", *source(), *full_maps, "-f", "null", "-"]
    span = media.decode_sample_seconds
    duration = summary.duration_seconds
    starts = sorted({0.0, max(duration / 2 - span / 2, 0.0), max(duration - span, 0.0)})
    args = ["-xerror"]
    maps: list[str] = []
    for index, start in enumerate(starts):
        args += ["-ss", f"{start:.3f}", "-t", f"{span:.3f}", *source()]
        maps += ["-map", f"{index}:{video}"]
        if audio is not None:
            maps += ["-map", f"{index}:{audio}"]
    return [*args, *maps, "-f", "null", "-"]


async def decode_check(
    sandbox: Sandbox,
    sniff: Sniff,
    path: Path,
    summary: MediaSummary,
    *,
    cwd: Path,
    record: list[RunResult] | None = None,
) -> RunResult:
    result = await sandbox.run(
        "ffmpeg",
        decode_args(sandbox.media, sniff, path, summary),
        cwd=cwd,
        deadline_seconds=media_deadline(sandbox.media, summary.duration_seconds),
        record=record,
    )
    if not result.ok:
        raise_decode_failed(result)
    return result


async def inspect_file(
    sandbox: Sandbox,
    path: Path,
    *,
    declared: Declared | None = None,
    tolerance: ToleranceConfig | None = None,
    record: list[RunResult] | None = None,
    decode: bool = True,
    provenance: ProvenanceReader | None = None,
    require_provenance: bool = False,
) -> tuple[Verdict, ProbeOutput | None]:
    """Sniff, probe, validate and decode-check ``path``; see the module docstring.
    ``decode=False``: the decode check is left to the caller (``checked_verdict``, or the
    probe job's fast path, whose frames pass decodes the whole source); the verdict says
    ``decode_check="deferred"`` until then. ``provenance``: the reader of its C2PA
    manifest store, run beside the probe."""
    sniff = sniff_file(path)
    if not sniff.accepted:
        assert sniff.reason is not None
        return _invalid(sniff.kind, [sniff.reason], None, "skipped", None), None
    isolated = bool(await sandbox.isolation_prefix())
    with sandbox.scratch() as scratch:
        found: list[Provenance] = []
        async with anyio.create_task_group() as group:
            if provenance is not None:
                reader = provenance

                async def read() -> None:
                    found.append(
                        await reader.read(path, kind=sniff.kind, cwd=scratch, record=record)
                    )

                group.start_soon(read)
            verdict, probe = await _inspect(
                sandbox, sniff, path, scratch, isolated, declared, tolerance, record, decode
            )
    if found:
        verdict = with_provenance(verdict, found[0], required=require_provenance)
    return verdict, probe


def with_provenance(verdict: Verdict, provenance: Provenance, *, required: bool) -> Verdict:
    """``verdict`` with the source's provenance; when it is ``required`` and missing or
    failed validation, the verdict is invalid (``provenance_missing``,
    ``provenance_invalid``). An untrusted signer still counts as provenance."""
    verdict = msgspec.structs.replace(verdict, provenance=provenance)
    if not required or not verdict.valid or provenance.verified:
        return verdict
    reason = "provenance_invalid" if provenance.present else "provenance_missing"
    detail = ", ".join(provenance.codes) or None
    return msgspec.structs.replace(
        verdict,
        verdict="invalid",
        error_class=InvalidMediaError.error_class,
        reasons=[reason],
        detail=detail,
    )


async def _inspect(
    sandbox: Sandbox,
    sniff: Sniff,
    path: Path,
    scratch: Path,
    isolated: bool,
    declared: Declared | None,
    tolerance: ToleranceConfig | None,
    record: list[RunResult] | None,
    decode: bool,
) -> tuple[Verdict, ProbeOutput | None]:
    media = sandbox.media
    try:
        probe, _ = await run_ffprobe(sandbox, sniff, path, cwd=scratch, record=record)
    except InvalidMediaError as exc:
        return _invalid(sniff.kind, exc.reasons, None, "skipped", isolated, exc.detail), None
    summary, reasons = validate(probe, media, declared=declared, tolerance=tolerance)
    if reasons or summary is None:
        return _invalid(sniff.kind, reasons, summary, "skipped", isolated), probe
    summary = await _with_frame_hdr(sandbox, sniff, path, summary, scratch, record)
    if media.decode_check != "none" and decode:
        try:
            await decode_check(sandbox, sniff, path, summary, cwd=scratch, record=record)
        except InvalidMediaError as exc:
            verdict = _invalid(
                sniff.kind, exc.reasons, summary, media.decode_check, isolated, exc.detail
            )
            return verdict, probe
    return (
        Verdict(
            verdict="valid",
            error_class=None,
            reasons=[],
            container=sniff.kind,
            media=summary,
            decode_check=media.decode_check if decode else DEFERRED,
            network_isolated=isolated,
        ),
        probe,
    )


async def _with_frame_hdr(
    sandbox: Sandbox,
    sniff: Sniff,
    path: Path,
    summary: MediaSummary,
    cwd: Path,
    record: list[RunResult] | None,
) -> MediaSummary:
    """An HDR source's metadata from its first frame when its stream lacks the mastering
    display or the light levels (HEVC and AV1 carry them in the bitstream). Only an HDR
    source pays for the frame: an SDR one has none to find."""
    hdr = summary.hdr
    if colour.dynamic_range(summary.colour) == "sdr" or (
        hdr is not None and hdr.mastering_display and hdr.content_light
    ):
        return summary
    side = await first_frame_side_data(
        sandbox, sniff, path, summary.video_stream_index, cwd=cwd, record=record
    )
    summary.hdr = colour.merged(hdr, colour.hdr_metadata(side))
    return summary


async def checked_verdict(
    sandbox: Sandbox,
    verdict: Verdict,
    sniff: Sniff,
    path: Path,
    *,
    cwd: Path,
    record: list[RunResult] | None = None,
) -> Verdict:
    """A valid verdict whose decode check was deferred, with that check run now: still
    valid, or invalid with the check's reasons."""
    if not verdict.valid or verdict.decode_check != DEFERRED or verdict.media is None:
        return verdict
    mode = sandbox.media.decode_check
    if mode != "none":
        try:
            await decode_check(sandbox, sniff, path, verdict.media, cwd=cwd, record=record)
        except InvalidMediaError as exc:
            return decode_failed(verdict, exc, mode)
    return msgspec.structs.replace(verdict, decode_check=mode)


def decode_failed(verdict: Verdict, exc: InvalidMediaError, mode: str) -> Verdict:
    """``verdict`` (valid, its decode check deferred) after that check failed."""
    failed = _invalid(
        verdict.container, exc.reasons, verdict.media, mode, verdict.network_isolated, exc.detail
    )
    return msgspec.structs.replace(failed, provenance=verdict.provenance)


def _invalid(
    container: str,
    reasons: list[str],
    summary: MediaSummary | None,
    decode: str,
    isolated: bool | None,
    detail: str | None = None,
) -> Verdict:
    return Verdict(
        verdict="invalid",
        error_class=InvalidMediaError.error_class,
        reasons=reasons,
        container=container,
        media=summary,
        decode_check=decode,
        network_isolated=isolated,
        detail=detail,
    )


def verdict_json(verdict: Verdict) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(verdict)
    return out
