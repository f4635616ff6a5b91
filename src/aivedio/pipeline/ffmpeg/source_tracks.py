"""The text tracks a render publishes with the HLS output: the source's own subtitle
streams (``mov_text``, ``subrip``, ``webvtt``), the captions its provider reported with it
(``providers.seam.ProviderCaption``), and, when it has neither, what the ``Transcriber``
makes (``pipeline/media/transcriber.py``; the null one makes nothing).

Each stream is converted to WebVTT by ffmpeg, sandboxed like every run over the source
(its input options, limits and deadline), and the converted text is then read as any
caption text from outside is: ``webvtt.clean`` writes the published file anew (a source's
subtitles are as untrusted as a sidecar). A stream that fails to convert or to clean is
left out with a warning: a broken subtitle stream never fails the video. At most
``MAX_SOURCE_TRACKS`` streams are published; the ones past it are logged.

The chunked assembly downloads the source for them when it has such streams (it reads
the source for nothing else when its rungs are all encoded from the chunks); a run without
the source at hand publishes no source tracks and says so in the log.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import msgspec

from aivedio.errors import AivedioError
from aivedio.logs import get_logger
from aivedio.pipeline.ffmpeg.packet_scans import PacketScans
from aivedio.pipeline.media import text_tracks, webvtt
from aivedio.pipeline.media.sniff import input_args
from aivedio.pipeline.media.text_tracks import Origin, TextTrack
from aivedio.pipeline.media.transcriber import NULL_TRANSCRIBER, Transcriber
from aivedio.pipeline.media.validate import MediaSummary, TextStream
from aivedio.providers.seam import ProviderCaption

log = get_logger("aivedio.media")

MAX_SOURCE_TRACKS = 8


def source_track(stream: TextStream, number: int, cues: int) -> TextTrack:
    """The record of the ``number``-th (from 1) source stream published as a track: its
    language tag (``und`` when it has none or one that is not BCP 47), its title as the
    label when that is a valid label, else its language and number."""
    language = stream.language if text_tracks.valid_language(stream.language) else "und"
    title = " ".join(stream.title.split())[:100]
    label = title if text_tracks.valid_label(title) else f"{language} ({number})"
    return text_tracks.make_track(
        f"source-{number}",
        kind="captions" if stream.captions else "subtitles",
        language=language,
        label=label,
        default=stream.default,
        origin="source",
        cues=cues,
    )


def provided_track(caption: ProviderCaption, track_id: str, origin: Origin, cues: int) -> TextTrack:
    """The record of captions a provider (or a transcriber) reported: its tag when that is
    BCP 47 (else ``und``), its label when valid (else its language), its kind."""
    language = caption.language if text_tracks.valid_language(caption.language) else "und"
    label = " ".join(caption.label.split())[:100]
    return text_tracks.make_track(
        track_id,
        kind="captions" if caption.kind == "captions" else "subtitles",
        language=language,
        label=label if text_tracks.valid_label(label) else language,
        default=caption.default,
        origin=origin,
        cues=cues,
    )


class SourceTracks(PacketScans):
    """Makes the render's text tracks, clean WebVTT under ``hls/text/``."""

    # Set by the worker (``MediaServices.equip``): the provider's captions of this source
    # and the transcriber asked when there are no others.
    provided_captions: tuple[ProviderCaption, ...] = ()
    transcriber: Transcriber = NULL_TRANSCRIBER

    async def _source_tracks(
        self, summary: MediaSummary, duration_seconds: float
    ) -> tuple[list[TextTrack], list[Path]]:
        """The tracks and their files (a WebVTT file and a subtitle playlist each)."""
        made: list[tuple[TextTrack, webvtt.Track]] = []
        streams = summary.text_streams
        at_hand = await anyio.Path(self.source).is_file()
        if streams and not at_hand:
            log.info("source_tracks_skipped", reason="source_not_at_hand", streams=len(streams))
        elif len(streams) > MAX_SOURCE_TRACKS:
            log.warning("source_tracks_capped", streams=len(streams), kept=MAX_SOURCE_TRACKS)
        for number, stream in enumerate(streams[:MAX_SOURCE_TRACKS] if at_hand else [], 1):
            captions = await self._converted(stream, duration_seconds)
            if captions is not None:
                made.append((source_track(stream, number, len(captions.cues)), captions))
        provided: list[tuple[ProviderCaption, str, Origin]] = [
            (c, f"provider-{n}", "provider") for n, c in enumerate(self.provided_captions, 1)
        ]
        if not made and not provided and at_hand:
            try:
                heard = await self.transcriber.transcribe(self.source, summary)
            except AivedioError as exc:
                log.warning(
                    "transcriber_failed", transcriber=self.transcriber.name, detail=exc.detail[:300]
                )
                heard = []
            provided = [(c, f"transcript-{n}", "transcriber") for n, c in enumerate(heard, 1)]
        for caption, track_id, origin in provided[:MAX_SOURCE_TRACKS]:
            try:
                cleaned = webvtt.clean(caption.text.encode())
            except webvtt.CaptionsRefused as exc:
                log.warning(
                    "provided_track_dropped",
                    origin=origin,
                    reason=exc.reason,
                    detail=exc.detail[:300],
                )
                continue
            made.append((provided_track(caption, track_id, origin, len(cleaned.cues)), cleaned))
        tracks: list[TextTrack] = []
        files: list[Path] = []
        for track, captions in made:
            if track.default and any(t.default for t in tracks):
                track = msgspec.structs.replace(track, default=False)  # one default at most
            tracks.append(track)
            root = self.layout.out
            vtt, playlist = root / track.vtt, root / track.playlist
            vtt.parent.mkdir(parents=True, exist_ok=True)
            vtt.write_text(captions.webvtt())
            playlist.write_text(text_tracks.subtitle_playlist(track, duration_seconds))
            files += [vtt, playlist]
        return tracks, files

    async def _converted(self, stream: TextStream, duration: float) -> webvtt.Track | None:
        """The stream converted by the sandboxed ffmpeg and cleaned; None when it fails."""
        target = self.layout.work / f"text-{stream.index}.vtt"
        args = [
            *input_args(
                self.sniff, self.source, max_streams=self.media.max_streams, max_pixels=None
            ),
            *("-map", f"0:{stream.index}", "-c:s", "webvtt", "-f", "webvtt", str(target)),
        ]
        try:
            await self._ffmpeg(f"text_track_{stream.index}", args, duration)
            data = await anyio.Path(target).read_bytes()
            return webvtt.clean(data)
        except (AivedioError, OSError, webvtt.CaptionsRefused) as exc:
            reason = exc.reason if isinstance(exc, webvtt.CaptionsRefused) else "convert_failed"
            log.warning(
                "source_track_dropped",
                stream_index=stream.index,
                codec=stream.codec_name,
                reason=reason,
                detail=re.sub(r"\s+", " ", str(exc))[:300],
            )
            return None
