"""Finalizing a run's outputs: each node's files checked (faststart, JPEG magic, the
sprite sheets' count), its indexes written (HLS master playlist, WebVTT, waveform JSON,
keyframe index) and every file described (size, SHA-256) in its ``OutputRecord``.

The playback MP4, the proxy and the poster are signed with the platform's C2PA manifest
(``Signing``, when the run has one) after their checks and before they are described, so
the SHA-256 recorded, uploaded and verified is the signed file's; a signed MP4 is checked
for faststart again (the manifest is a box before ``moov``)."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec

from aivedio.errors import RenderError, SigningError
from aivedio.logs import get_logger
from aivedio.pipeline.ffmpeg.outputs import OutputRecord, describe, require_faststart, require_jpeg
from aivedio.pipeline.ffmpeg.packet_scans import packet_args
from aivedio.pipeline.ffmpeg.provenance_read import MIME_OF_KIND
from aivedio.pipeline.ffmpeg.source_tracks import SourceTracks
from aivedio.pipeline.media import hls, keyframes, text_tracks, thumbnails, waveform
from aivedio.pipeline.media.plan import Plan, Rung
from aivedio.pipeline.media.signing import Signed, SignRequest, actions_for
from aivedio.pipeline.media.validate import MediaSummary

log = get_logger("aivedio.media")


def _video_range(rung: Rung, plan: Plan) -> str:
    """A variant's VIDEO-RANGE: said for every variant of a presentation with an HDR10
    rendition (PQ for it, SDR for the rest), for none otherwise."""
    if not any(r.dynamic_range == "pq" for r in plan.renditions):
        return ""
    return "PQ" if rung.dynamic_range == "pq" else "SDR"


class Finalizing(SourceTracks):
    """The last step of every node: from files in ``out/`` to a verified record."""

    async def _finalize(self, node: str, plan: Plan, summary: MediaSummary) -> OutputRecord:
        layout = self.layout
        top = plan.top
        required = node in plan.required
        source_size = (summary.display_width, summary.display_height)
        if node == "playback":
            require_faststart(layout.playback)
            signed = await self._sign(
                node, layout.playback, "video/mp4", top.copy, (top.width, top.height) != source_size
            )
            if signed is not None and signed.signed:
                require_faststart(layout.playback)
            record = await self._record(
                node,
                "playback.mp4",
                [layout.playback],
                required,
                width=top.width,
                height=top.height,
                codec="h264",
            )
            record.c2pa = signed
            return record
        if node == "poster":
            require_jpeg(layout.poster)
            signed = await self._sign(
                node, layout.poster, "image/jpeg", False, (top.width, top.height) != source_size
            )
            record = await self._record(node, "poster.jpg", [layout.poster], required)
            record.c2pa = signed
            return record
        if node == "proxy":
            require_faststart(layout.proxy)
            assert plan.proxy is not None
            proxy_size = (plan.proxy.width, plan.proxy.height)
            signed = await self._sign(
                node, layout.proxy, "video/mp4", plan.proxy.copy, proxy_size != source_size
            )
            if signed is not None and signed.signed:
                require_faststart(layout.proxy)
            record = await self._record(
                node,
                "proxy.mp4",
                [layout.proxy],
                required,
                width=plan.proxy.width,
                height=plan.proxy.height,
                codec="h264",
            )
            record.c2pa = signed
            return record
        if node == "hls":
            renditions = [
                hls.Rendition(
                    name=r.name,
                    width=r.width,
                    height=r.height,
                    frame_rate=summary.frame_rate if r.copy else plan.frame_rate,
                    has_audio=summary.audio_codec is not None,
                    video_range=_video_range(r, plan),
                )
                for r in plan.renditions
            ]
            files: list[Path] = []
            for rendition in renditions:
                files += hls.files_of(layout.hls, rendition.name)
            master = layout.hls / "master.m3u8"
            record_provenance = self.signing is not None
            text = hls.master_playlist(layout.hls, renditions, provenance=record_provenance)
            # The source's subtitle streams, as text tracks named by the master.
            tracks, track_files = await self._source_tracks(summary, plan.duration_seconds)
            if tracks:
                text = text_tracks.master_with_tracks(text, tracks)
                files += track_files
            master.write_text(text)
            if record_provenance:
                files.append(await self._hls_provenance(files))
            record = await self._record(
                node,
                "hls/master.m3u8",
                [master, *files],
                required,
                width=top.width,
                height=top.height,
                codec="h264,av1" if plan.av1_rungs else "h264",
            )
            record.tracks = tracks or None
            return record
        if node == "sprite":
            return await self._finalize_sprite(plan, summary, required)
        if node == "waveform":
            return await self._finalize_waveform(plan, summary, required)
        if node == "keyframes":
            return await self._finalize_keyframes(plan, required)
        raise ValueError(f"unknown output {node!r}")

    async def _hls_provenance(self, files: list[Path]) -> Path:
        """Write the rendition set's ``provenance.json`` (``hls.provenance_record``)."""
        hls_dir = self.layout.hls
        digests = await anyio.to_thread.run_sync(
            lambda: [describe(p, hls_dir).sha256 for p in files]
        )
        source = self.source_provenance
        record = hls.provenance_record(
            hls_dir, files, digests, msgspec.to_builtins(source) if source else None
        )
        path = hls_dir / hls.PROVENANCE_FILE
        path.write_bytes(msgspec.json.encode(record))
        return path

    async def _sign(
        self, node: str, path: Path, mime: str, copied: bool, resized: bool
    ) -> Signed | None:
        """Sign ``path`` in place when the run signs ``node``: the signer's record of it,
        or None when it is not signed. A failed signing raises ``SigningError`` (the node
        fails), unless the run publishes unsigned: then the reason is recorded."""
        signing = self.signing
        if signing is None or node not in signing.outputs:
            return None
        if not await anyio.Path(self.source).is_file():
            # The chunked assembly never has the source at hand: without its parent, a
            # manifest would claim the platform created the picture.
            return Signed(signed=False, unsigned_reason="source_not_at_hand")
        request = SignRequest(
            output=node,
            path=str(path),
            mime=mime,
            actions=actions_for(node, copied=copied, resized=resized),
            source_path=str(self.source),
            source_mime=MIME_OF_KIND.get(self.sniff.kind),
            source=self.source_provenance,
        )
        try:
            signed = await signing.signer.sign(request)
        except SigningError as exc:
            if not signing.publish_unsigned:
                raise
            log.warning("output_signing_failed", output=node, detail=exc.detail[:300])
            return Signed(signed=False, unsigned_reason=exc.detail[:300])
        if not signed.signed:
            log.info("output_unsigned", output=node, reason=signed.unsigned_reason)
        return signed

    async def _finalize_sprite(
        self, plan: Plan, summary: MediaSummary, required: bool
    ) -> OutputRecord:
        layout = self.layout
        sheet_layout = thumbnails.sprite_layout(
            plan.duration_seconds,
            interval=plan.sprite_interval,
            columns=self.media.sprite_columns,
            rows=self.media.sprite_rows,
        )
        sheets = sorted(layout.sprites.glob("sprite_*.jpg"))
        if len(sheets) < sheet_layout.sheets:
            raise RenderError(f"sprite: {len(sheets)} sheets made, {sheet_layout.sheets} expected")
        sheets = sheets[: sheet_layout.sheets]
        for sheet in sheets:
            require_jpeg(sheet)
        width, height = thumbnails.jpeg_dimensions(sheets[0])
        thumb_w = width // self.media.sprite_columns
        thumb_h = height // self.media.sprite_rows
        vtt = layout.sprites / "thumbnails.vtt"
        vtt.write_text(
            thumbnails.webvtt_index(sheet_layout, thumb_width=thumb_w, thumb_height=thumb_h)
        )
        return await self._record(
            "sprite",
            "sprites/thumbnails.vtt",
            [vtt, *sheets],
            required,
            width=thumb_w,
            height=thumb_h,
        )

    async def _finalize_waveform(
        self, plan: Plan, summary: MediaSummary, required: bool
    ) -> OutputRecord:
        layout = self.layout
        if summary.audio_codec is None:
            peaks = waveform.silent_waveform(
                plan.duration_seconds, plan.waveform_sample_rate, plan.waveform_zooms
            )
        else:
            peaks = await anyio.to_thread.run_sync(
                lambda: waveform.compute_peaks(
                    layout.pcm, sample_rate=plan.waveform_sample_rate, zooms=plan.waveform_zooms
                )
            )
        paths = waveform.write_waveforms(peaks, layout.waveform)
        primary = f"waveform/waveform_{plan.waveform_zooms[0]}.json"
        return await self._record("waveform", primary, paths, required)

    async def _finalize_keyframes(self, plan: Plan, required: bool) -> OutputRecord:
        layout = self.layout
        if not layout.playback.exists():
            raise RenderError("keyframes: the playback MP4 is not there (it failed)")
        text = await self._ffprobe_csv("keyframes", packet_args(None, layout.playback))
        index = keyframes.keyframe_index(
            keyframes.parse_packets(text), duration_seconds=plan.duration_seconds
        )
        layout.keyframes.write_bytes(msgspec.json.encode(index))
        return await self._record("keyframes", "keyframes.json", [layout.keyframes], required)

    async def _record(
        self,
        node: str,
        primary: str,
        paths: list[Path],
        required: bool,
        *,
        width: int | None = None,
        height: int | None = None,
        codec: str | None = None,
    ) -> OutputRecord:
        out = self.layout.out
        files = await anyio.to_thread.run_sync(lambda: [describe(p, out) for p in paths])
        record = OutputRecord(
            variant_type=node,
            primary=primary,
            files=files,
            required=required,
            width=width,
            height=height,
            codec=codec,
        )
        if node in ("playback", "proxy") and self.report and self.report.plan:
            seconds = max(self.report.plan.duration_seconds, 0.001)
            record.bitrate = int(record.primary_file().size * 8 / seconds)
        return record
