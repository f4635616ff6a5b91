"""Packet scans with ffprobe: the source's keyframes and stream starts (for the plan) and
the one timestamp offset every HLS rendition is muxed with."""

from __future__ import annotations

import time
from pathlib import Path

from aivedio.pipeline.ffmpeg.run_processes import RunProcesses
from aivedio.pipeline.media import keyframes
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media.sniff import MP4, Sniff, input_args
from aivedio.pipeline.media.validate import MediaSummary

# Packets read from the head of a file to find its earliest timestamp (reorder delay and
# audio priming show up within the first few).
HEAD_PACKETS = 48
AUDIO_HEAD_PACKETS = 8  # the audio's start: its first packets
# A scan of every stream prints every audio packet: at ~40 bytes a line, 500,000 are ~20 MB
# of ffprobe output, a third of the sandbox's stdout cap (an hour of 60 fps video with AAC
# at 48 kHz is about 385,000).
ONE_SCAN_MAX_PACKETS = 500_000


class PacketScans(RunProcesses):
    """The scans of a run that read packets, not frames."""

    async def _source_keyframes(
        self, summary: MediaSummary
    ) -> tuple[list[float], float | None, list[keyframes.Packet], float | None]:
        """The source's video keyframe times, the earliest audio packet's time, the video
        packets (decode order) the chunked path splits by, and the earliest pts or dts among
        the first packets of both (``Plan.source_earliest``)."""
        assert self._sniff is not None and self.report is not None
        started = time.monotonic()
        video, audio = summary.video_stream_index, summary.audio_stream_index
        heads: list[keyframes.Packet] = []
        if audio is not None and one_scan(summary):
            # One scan of every stream (ffprobe demuxes them all either way), split here: a
            # process fewer than a scan per stream, for the audio lines the split skips.
            args = packet_args(
                self._sniff,
                self.source,
                stream=None,
                indexed=True,
                max_streams=self.media.max_streams,
            )
            text = await self._ffprobe_csv("keyframe_scan", args)
            parts = keyframes.by_stream(text, {video: None, audio: AUDIO_HEAD_PACKETS})
            packets = keyframes.parse_packets(parts[video])
            heads = keyframes.parse_packets(parts[audio])
        else:
            # Other tracks (up to max_streams), audio of unknown or high packet rate, or
            # just too many packets: the other lines are never printed, a scan per stream.
            args = packet_args(
                self._sniff, self.source, stream=str(video), max_streams=self.media.max_streams
            )
            packets = keyframes.parse_packets(await self._ffprobe_csv("keyframe_scan", args))
            if audio is not None:
                args = packet_args(
                    self._sniff,
                    self.source,
                    stream=str(audio),
                    first=AUDIO_HEAD_PACKETS,
                    max_streams=self.media.max_streams,
                )
                heads = keyframes.parse_packets(await self._ffprobe_csv("audio_start_scan", args))
        starts = [p.pts for p in heads if p.pts is not None]
        audio_start = min(starts) if starts else None
        times = keyframes.keyframe_pts(packets)
        stamps = [
            value
            for packet in (*packets[:HEAD_PACKETS], *heads)
            for value in (packet.pts, packet.dts)
            if value is not None
        ]
        self.report.steps["keyframe_scan"] = time.monotonic() - started
        return times, audio_start, packets, min(stamps, default=None)

    async def _hls_offset(self, plan: Plan, has_audio: bool) -> float:
        """The one timestamp offset for every rendition: the earliest timestamp among the
        packets that will be muxed, negated (1 ms margin), or 0."""
        inputs: list[tuple[Sniff | None, Path, str | None]] = []
        earliest = 0.0
        encoded = [r for r in plan.renditions if not r.copy]
        if plan.top.copy:
            # The source's own packets: known from the probe's scans, when it recorded them;
            # else scanned, the planned streams only (an ignored track may start earlier).
            if plan.source_earliest is None:
                inputs.append((self._sniff, self.source, str(plan.video_stream)))
                if has_audio and plan.audio_stream is not None:
                    inputs.append((self._sniff, self.source, str(plan.audio_stream)))
            else:
                earliest = min(earliest, plan.source_earliest)
        inputs += [(None, self.layout.rung_video(r), None) for r in encoded]
        # The audio file is muxed with the encoded rungs (and with a copied one when the
        # plan encodes its audio: normalized; else it takes the source's own).
        if has_audio and (encoded or plan.audio == "aac") and self.layout.audio.exists():
            inputs.append((None, self.layout.audio, None))
        for sniff, path, stream in inputs:
            args = packet_args(
                sniff, path, stream=stream, first=HEAD_PACKETS, max_streams=self.media.max_streams
            )
            for packet in keyframes.parse_packets(await self._ffprobe_csv("ts_scan", args)):
                for value in (packet.pts, packet.dts):
                    if value is not None:
                        earliest = min(earliest, value)
        return 0.0 if earliest >= 0 else round(-earliest + 0.001, 3)


def one_scan(summary: MediaSummary) -> bool:
    """Whether one scan of every stream is bounded: the file holds just the video and the
    AAC audio a render uses (an AAC packet is 1,024 samples: a known rate), and their
    packets together stay under ONE_SCAN_MAX_PACKETS (ffprobe's output under its cap)."""
    others = summary.subtitle_streams + summary.attachment_streams + summary.data_streams
    if summary.video_streams != 1 or summary.audio_streams != 1 or others:
        return False
    if summary.audio_codec != "aac" or not summary.audio_sample_rate:
        return False
    per_second = max(summary.frame_rate, summary.real_frame_rate) + summary.audio_sample_rate / 1024
    return summary.duration_seconds * per_second <= ONE_SCAN_MAX_PACKETS


def packet_args(
    sniff: Sniff | None,
    path: Path,
    *,
    stream: str | None = "v:0",
    first: int | None = None,
    indexed: bool = False,
    max_streams: int | None = None,
) -> list[str]:
    """ffprobe's packets of ``stream`` (None: every stream), ``pts_time,dts_time,pos,flags``
    a line (``indexed``: ``stream_index`` first, for ``keyframes.by_stream``). The source is
    opened under the same stream cap as the verdict's probe (``max_streams``)."""
    source = input_args(sniff or MP4, path, max_streams=max_streams)
    head = ["-read_intervals", f"%+#{first}"] if first else []
    select = ["-select_streams", stream] if stream else []
    fields = ("stream_index," if indexed else "") + "pts_time,dts_time,pos,flags"
    return [*source, *head, *select, "-show_entries", f"packet={fields}", "-of", "csv=p=0"]
