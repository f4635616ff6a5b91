"""ffmpeg argument lists for the plan's passes. Pure: paths in, argv out.

* ``encode_args``: ONE decode of the source feeding every transcoded rung, the editor proxy,
  the poster, the sprite sheets and the waveform's PCM through a single ``split`` filter
  graph (about half the CPU of one decode per output, see docs/benchmarks.md). Video-only
  intermediates go to ``work/``; audio is encoded (or copied) once.
* ``package_args``: copy-only muxing of intermediates (or, when remuxing, of the source's own
  streams) into the playback MP4 (``+faststart``), the proxy MP4 and one fMP4 HLS rendition
  per rung. No decode, no encode.
* ``poster_seek_args``: a poster by input seek, when no encode pass runs (remux).
* ``merge_runs``: those runs as one process.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from aivedio.config.media import MediaConfig
from aivedio.pipeline.media import av1
from aivedio.pipeline.media.chunks import NUT, Chunking, forced_keyframes, timing_filter
from aivedio.pipeline.media.colour import Colour, colour_args
from aivedio.pipeline.media.layout import Layout
from aivedio.pipeline.media.loudness import measure_filter
from aivedio.pipeline.media.plan import AUDIO_MAX_RATE, Plan, Rung
from aivedio.pipeline.media.rider import Rider
from aivedio.pipeline.media.sniff import MP4, Sniff, input_args
from aivedio.pipeline.media.thumbnails import sprite_filter

KEYFRAME_EPSILON = 0.0005  # force a key on the frame AT the cut, never the one after


@dataclass(frozen=True, slots=True)
class EncodeJob:
    """What one encode pass produces (the flags say which branches the graph has)."""

    rungs: tuple[Rung, ...]
    proxy: bool
    poster: bool
    sprite: bool
    pcm: bool
    audio: bool

    @property
    def empty(self) -> bool:
        return not (self.rungs or self.proxy or self.poster or self.sprite or self.pcm)


def encode_job(
    plan: Plan, wants: set[str], *, has_audio: bool, encoded: Collection[str] = ()
) -> EncodeJob:
    """The branches an encode pass needs to serve ``wants``. ``encoded``: rungs whose video
    is already in ``work/`` (the top rung of a transcode, taken from the playback the fast
    path published: the same encode, made once)."""
    rungs: list[Rung] = []
    if "hls" in wants:
        rungs = [r for r in plan.renditions if not r.copy and r.name not in encoded]
    top_encoded = plan.top.copy or plan.top.name in encoded
    if "playback" in wants and not top_encoded and plan.top not in rungs:
        rungs.insert(0, plan.top)
    # Encoded audio: a transcode's, or a remux's whose audio is normalized (its video copied).
    needs_audio_file = plan.audio == "aac" and ("playback" in wants or "hls" in wants)
    return EncodeJob(
        rungs=tuple(rungs),
        proxy="proxy" in wants,
        poster="poster" in wants and plan.mode == "transcode",
        sprite="sprite" in wants,
        pcm="waveform" in wants and has_audio,
        audio=has_audio and (needs_audio_file or "proxy" in wants or "hls" in wants),
    )


def encoded_colour(plan: Plan) -> Colour | None:
    """The colour of an encoded rendition: the plan's, in limited range (each rung's
    ``scale`` converts a full-range source); None for a plan recorded without colour."""
    if plan.colour is None:
        return None
    return Colour(
        primaries=plan.colour.primaries,
        transfer=plan.colour.transfer,
        matrix=plan.colour.matrix,
        range="tv",
    )


def rung_scale(rung: Rung, pixel_format: str = "yuv420p") -> str:
    """A rung's size, limited range, 4:2:0 (8-bit: H.264 High), square pixels."""
    return (
        f"scale={rung.width}:{rung.height}:flags=bicubic:out_range=tv,"
        f"format={pixel_format},setsar=1"
    )


def _rung_chain(rung: Rung, media: MediaConfig) -> str:
    """The chain after the split that makes ``rung``'s frames: an AV1 rung at the size of
    an H.264 one (both 8-bit) has the same chain, so the two share one scale."""
    if rung.dynamic_range == "pq":  # the HDR10 rendition: always 10-bit
        return rung_scale(rung, "yuv420p10le")
    if rung.codec == "av1":
        return rung_scale(rung, av1.pixel_format(media.av1))
    return rung_scale(rung)


def _x264(
    rung: Rung, media: MediaConfig, keyframes: list[str], *, gop: int, colour: Colour | None
) -> list[str]:
    args = ["-c:v", "libx264", "-preset", media.x264_preset, "-crf", str(rung.crf)]
    if rung.maxrate_kbps:
        args += ["-maxrate", f"{rung.maxrate_kbps}k", "-bufsize", f"{rung.bufsize_kbps}k"]
    args += ["-profile:v", "high", "-pix_fmt", "yuv420p", "-g", str(gop), "-sc_threshold", "0"]
    if media.threads:
        args += ["-threads", str(media.threads)]
    if colour is not None:
        args += colour_args(colour)
    return args + keyframes


def _video_encoder(
    rung: Rung, plan: Plan, media: MediaConfig, keys: list[str], *, gop: int, av1_gop: int
) -> list[str]:
    """A rendition's encoder with its colour tags: x264 with ``keys`` forced (``gop`` its
    cap), or SVT-AV1 with a fixed GOP of ``av1_gop`` frames (its keyframes cannot be
    forced); the HDR10 rendition tagged with the source's colour, the rest with the plan's."""
    colour = encoded_colour(plan)
    if rung.codec != "av1":
        return _x264(rung, media, keys, gop=gop, colour=colour)
    pq = rung.dynamic_range == "pq"
    encoder = av1.encoder_args(
        crf=rung.crf,
        maxrate_kbps=rung.maxrate_kbps,
        gop_frames=av1_gop,
        media=media,
        hdr10_params=plan.hdr10_params if pq else "",
    )
    tags = plan.hdr10_colour if pq else colour
    return encoder + (colour_args(tags) if tags is not None else [])


def _forced_keyframes(plan: Plan) -> list[str]:
    if plan.mode == "remux" and plan.cut_points is not None:
        if not plan.cut_points:
            return []
        times = ",".join(f"{max(t - KEYFRAME_EPSILON, 0.0):.6f}" for t in plan.cut_points)
        return ["-force_key_frames", times]
    return ["-force_key_frames", f"expr:gte(t,n_forced*{plan.segment_seconds:g})"]


def _audio_encode(
    media: MediaConfig, channels: int | None, rate: int | None, audio_filter: str = ""
) -> list[str]:
    args = ["-filter:a", audio_filter] if audio_filter else []
    args += ["-c:a", "aac", "-profile:a", "aac_low", "-b:a", f"{media.audio_bitrate_kbps}k"]
    if channels is None or channels > 2:
        args += ["-ac", "2"]
    if rate is None or rate > AUDIO_MAX_RATE:
        args += ["-ar", str(AUDIO_MAX_RATE)]
    return args


def _hdr10_branches(trunk: str, pre: list[str], hdr: list[int], job: EncodeJob) -> list[str]:
    """The HDR10 renditions (``job.rungs[i]`` for ``i`` in ``hdr``) leave the decode before
    the colour chain (the tone map the SDR renditions get): 10-bit, the source's PQ
    picture scaled; the rest goes on as ``[v_sdr]``."""
    others = len(job.rungs) > len(hdr) or job.proxy or job.poster or job.sprite
    outs = ("[v_sdr]" if others else "") + "".join(f"[v_h{i}]" for i in hdr)
    split = ",".join([*pre, f"split={len(hdr) + (1 if others else 0)}"])
    lines = [f"{trunk}{split}{outs}"]
    lines += [f"[v_h{i}]{rung_scale(job.rungs[i], 'yuv420p10le')}[o_r{i}]" for i in hdr]
    return lines


def encode_args(
    plan: Plan,
    job: EncodeJob,
    media: MediaConfig,
    sniff: Sniff,
    source: Path,
    layout: Layout,
    *,
    audio_channels: int | None,
    audio_rate: int | None,
    rider: Rider | None = None,
) -> list[str]:
    """One ffmpeg invocation: decode once, split, encode every branch of ``job`` (and
    ``rider``'s outputs from the same decode)."""
    args = input_args(sniff, source, max_streams=media.max_streams, max_pixels=media.max_pixels)
    pre = []
    if plan.mode == "transcode":
        pre.append(f"fps={plan.frame_rate_expr}")
    trunk = f"[{plan.video_map}]"
    graph: list[str] = []
    hdr = [i for i, rung in enumerate(job.rungs) if rung.dynamic_range == "pq"]
    if hdr:
        graph += _hdr10_branches(trunk, pre, hdr, job)
        trunk, pre = "[v_sdr]", []
    if plan.colour_filter:  # once, before the split: every branch gets the planned colour
        pre.append(plan.colour_filter)
    branches: list[tuple[str, str]] = []  # (label, chain after split)
    shared: dict[str, list[int]] = {}  # a rung chain -> the rungs (indexes) it feeds
    for index, rung in enumerate(job.rungs):
        if index not in hdr:
            shared.setdefault(_rung_chain(rung, media), []).append(index)
    for chain, indexes in shared.items():
        if len(indexes) > 1:
            chain += f",split={len(indexes)}"
        branches.append((f"r{indexes[0]}", chain))
    if job.proxy and plan.proxy is not None:
        branches.append(("px", rung_scale(plan.proxy)))
    if job.poster:
        frame = max(int(plan.poster_seconds * plan.frame_rate), 0)
        top = plan.top
        branches.append(("po", f"select='eq(n\\,{frame})',scale={top.width}:{top.height},setsar=1"))
    if job.sprite:
        chain = sprite_filter(
            interval=plan.sprite_interval,
            width=plan.sprite_width,
            height=plan.sprite_height,
            columns=media.sprite_columns,
            rows=media.sprite_rows,
        )
        branches.append(("sp", chain))
    if rider is not None:
        branches.append(("fm", "null"))  # into RIDER_VIDEO, "[o_fm]"
    if branches:
        head = ",".join([*pre, f"split={len(branches)}"]) if len(branches) > 1 or pre else "null"
        if len(branches) == 1 and pre:
            head = ",".join(pre)
        outs = "".join(f"[s_{label}]" for label, _ in branches)
        graph.append(f"{trunk}{head}{outs}")
        outputs = {f"r{ixs[0]}": "".join(f"[o_r{i}]" for i in ixs) for ixs in shared.values()}
        graph += [
            f"[s_{label}]{chain}{outputs.get(label, f'[o_{label}]')}" for label, chain in branches
        ]
    if job.pcm:
        rate = plan.waveform_sample_rate
        graph.append(
            f"[{plan.audio_map}]aresample={rate},aformat=sample_fmts=s16:channel_layouts=mono"
            "[o_wave]"
        )
    if rider is not None:
        graph += rider.graph
    if graph:
        args += ["-filter_complex", ";".join(graph)]
    # Remux: the copied rung's cut points decide, so lower rungs may have no keyframe but
    # the forced ones (a GOP longer than the media); transcode: a generous cap.
    gop = 1_000_000 if plan.mode == "remux" else max(plan.gop_frames * 10, 250)
    keys = _forced_keyframes(plan)
    colour = encoded_colour(plan)
    for index, rung in enumerate(job.rungs):
        encoder = _video_encoder(rung, plan, media, keys, gop=gop, av1_gop=plan.gop_frames)
        args += ["-map", f"[o_r{index}]", *encoder, "-an"]
        args += ["-f", "mp4", str(layout.rung_video(rung))]
    if job.proxy and plan.proxy is not None:
        gop_p = str(media.proxy_gop_frames)
        x264 = _x264(plan.proxy, media, [], gop=media.proxy_gop_frames, colour=colour)
        args += ["-map", "[o_px]", *x264]
        args += ["-keyint_min", gop_p, "-bf", "0", "-an", "-f", "mp4", str(layout.proxy_video)]
    if job.poster:
        args += ["-map", "[o_po]", "-frames:v", "1", "-q:v", POSTER_JPEG_QUALITY, "-update", "1"]
        args += ["-f", "image2", str(layout.poster)]
    if job.sprite:
        args += ["-map", "[o_sp]", "-q:v", "5", "-f", "image2"]
        args += [str(layout.sprites / "sprite_%03d.jpg")]
    if job.pcm:
        args += ["-map", "[o_wave]", "-f", "s16le", str(layout.pcm)]
    if job.audio:
        args += ["-map", plan.audio_map, "-vn"]
        if plan.audio == "copy":
            args += ["-c:a", "copy"]
        else:
            args += _audio_encode(media, audio_channels, audio_rate, plan.audio_filter)
        args += ["-f", "mp4", str(layout.audio)]
    if rider is not None:
        args += rider.outputs
        if rider.xerror:
            args = ["-xerror", *args]
    return args


def measure_args(
    plan_audio: int, media: MediaConfig, sniff: Sniff, source: Path, measured: Path
) -> list[str]:
    """The audio stream ``plan_audio`` (absolute index) decoded through ``ebur128`` into the
    null muxer, its figures printed to ``measured``: the loudness where no other pass
    decodes the audio before the plan is made."""
    return [
        *input_args(sniff, source, max_streams=media.max_streams, max_pixels=media.max_pixels),
        "-map",
        f"0:{plan_audio}",
        "-filter:a",
        measure_filter(measured.name),
        "-f",
        "null",
        "-",
    ]


def pieces_args(
    plan: Plan,
    chunking: Chunking,
    index: int,
    rungs: list[tuple[Rung, Path]],
    media: MediaConfig,
    chunk: Path,
) -> list[str]:
    """Several renditions of one chunk from one decode: the chunk's frames re-timed once,
    then split, each branch scaled and encoded as its own ``(chunk, rendition)`` encode
    would be (the same frames into the same encoder settings). An AV1 rendition's GOP is
    the chunk's (``av1.chunk_gop_frames``): its keyframes fall every GOP from the chunk's
    first frame; an HDR10 one leaves before the colour chain, as in ``encode_args``."""
    timing = timing_filter(chunking, index, plan.frame_rate_expr)
    gop = 1_000_000 if plan.mode == "remux" else max(plan.gop_frames * 10, 250)
    cuts = plan.cut_points if plan.mode == "remux" else None
    keys = forced_keyframes(chunking, index, segment_seconds=plan.segment_seconds, cut_points=cuts)
    frames = chunking.output_frames(index, plan.frame_rate)
    av1_gop = av1.chunk_gop_frames(frames, plan.gop_frames)

    # passthrough: the timing filter made exactly the frames wanted, at the chunk's own
    # times; a filter_complex output would otherwise be filled with copies from time 0.
    tail = ["-fps_mode", "passthrough", "-an", "-f", "mp4"]
    args = input_args(NUT, chunk)
    if len(rungs) == 1:
        rung = rungs[0][0]
        colour = [plan.colour_filter] if plan.colour_filter and rung.dynamic_range != "pq" else []
        args += ["-map", "0:v:0", "-vf", ",".join([timing, *colour, _rung_chain(rung, media)])]
    else:
        graph = _pieces_graph(plan, timing, [rung for rung, _ in rungs], media)
        args += ["-filter_complex", ";".join(graph)]
    for i, (rung, output) in enumerate(rungs):
        maps = ["-map", f"[o{i}]"] if len(rungs) > 1 else []
        encoder = _video_encoder(rung, plan, media, keys, gop=gop, av1_gop=av1_gop)
        args += [*maps, *encoder, *tail, str(output)]
    return args


def _pieces_graph(plan: Plan, timing: str, rungs: list[Rung], media: MediaConfig) -> list[str]:
    """The filter graph of ``pieces_args``, ``[o{i}]`` for ``rungs[i]``: the re-timed frames,
    the HDR10 branches split off before the colour chain, the rest coloured once, then
    split; renditions with the same chain (an AV1 rung and its 8-bit H.264 twin) share it."""
    hdr = [i for i, rung in enumerate(rungs) if rung.dynamic_range == "pq"]
    sdr = [i for i, rung in enumerate(rungs) if rung.dynamic_range != "pq"]
    colour = [plan.colour_filter] if plan.colour_filter else []
    graph: list[str] = []
    trunk, pre = "[0:v:0]", [timing, *colour]
    if hdr:
        outs = ("[v_sdr]" if sdr else "") + "".join(f"[v_h{i}]" for i in hdr)
        graph.append(f"[0:v:0]{timing},split={len(hdr) + (1 if sdr else 0)}{outs}")
        graph += [f"[v_h{i}]{_rung_chain(rungs[i], media)}[o{i}]" for i in hdr]
        trunk, pre = "[v_sdr]", colour
    shared: dict[str, list[int]] = {}  # a chain -> the renditions (indexes) it feeds
    for i in sdr:
        shared.setdefault(_rung_chain(rungs[i], media), []).append(i)

    def outputs(indexes: list[int]) -> str:
        fan = f",split={len(indexes)}" if len(indexes) > 1 else ""
        return fan + "".join(f"[o{i}]" for i in indexes)

    if len(shared) == 1:
        ((chain, indexes),) = shared.items()
        graph.append(f"{trunk}{','.join([*pre, chain])}{outputs(indexes)}")
    elif shared:
        labels = "".join(f"[s{indexes[0]}]" for indexes in shared.values())
        graph.append(f"{trunk}{','.join([*pre, f'split={len(shared)}'])}{labels}")
        graph += [f"[s{ixs[0]}]{chain}{outputs(ixs)}" for chain, ixs in shared.items()]
    return graph


def package_args(
    plan: Plan,
    wants: set[str],
    media: MediaConfig,
    sniff: Sniff,
    source: Path,
    layout: Layout,
    *,
    has_audio: bool,
    hls_offset: float = 0.0,
) -> list[list[str]]:
    """Copy-only muxing runs: playback, proxy and one per HLS rendition.

    ``hls_offset`` shifts every rendition by the same amount, enough that no timestamp is
    negative: otherwise the muxer shifts each rendition by its own earliest DTS (B-frame
    delay, AAC priming), and a copied rung and an encoded one drift apart by milliseconds.
    """
    source_in = input_args(sniff, source, max_streams=media.max_streams)
    runs: list[list[str]] = []
    audio_in = input_args(MP4, layout.audio) if has_audio else []

    def video_input(rung: Rung) -> list[str]:
        return source_in if rung.copy else input_args(MP4, layout.rung_video(rung))

    def audio_map(video_only_input: bool) -> list[str]:
        if not has_audio:
            return []
        return ["-map", "1:a:0"] if video_only_input else ["-map", plan.audio_map]

    def video_map(from_source: bool) -> list[str]:
        return ["-map", plan.video_map if from_source else "0:v:0"]

    # A copied rung keeps the source's audio unless the plan encodes it (normalized).
    copy_own_audio = plan.audio != "aac"
    # The copied rung's colour tags: its container's (the bitstream stays the source's).
    copy_tags = colour_args(plan.colour) if plan.colour is not None else []

    def rung_io(rung: Rung) -> tuple[list[str], list[str], list[str]]:
        """A rendition's inputs, maps and colour tags."""
        if not rung.copy:
            return [*video_input(rung), *audio_in], ["-map", "0:v:0", *audio_map(True)], []
        if copy_own_audio:
            return source_in, [*video_map(True), *audio_map(False)], copy_tags
        return [*source_in, *audio_in], [*video_map(True), *audio_map(True)], copy_tags

    if "playback" in wants:
        inputs, maps, tags = rung_io(plan.top)
        runs.append(
            [
                *inputs,
                *maps,
                "-c",
                "copy",
                *tags,
                "-movflags",
                "+faststart",
                "-f",
                "mp4",
                str(layout.playback),
            ]
        )
    if "proxy" in wants:
        inputs = [*input_args(MP4, layout.proxy_video), *audio_in]
        runs.append(
            [
                *inputs,
                "-map",
                "0:v:0",
                *audio_map(True),
                "-c",
                "copy",
                "-movflags",
                "+faststart",
                "-f",
                "mp4",
                str(layout.proxy),
            ]
        )
    if "hls" in wants:
        for rung in plan.renditions:
            directory = layout.hls_rung(rung)
            inputs, maps, tags = rung_io(rung)
            runs.append(
                [
                    *inputs,
                    *maps,
                    "-c",
                    "copy",
                    *tags,
                    "-output_ts_offset",
                    f"{hls_offset:.6f}",
                    "-f",
                    "hls",
                    "-hls_time",
                    _hls_time(plan, rung),
                    "-hls_playlist_type",
                    "vod",
                    "-hls_segment_type",
                    "fmp4",
                    "-hls_flags",
                    "independent_segments",
                    "-hls_fmp4_init_filename",
                    "init.mp4",
                    "-hls_segment_filename",
                    str(directory / "seg_%05d.m4s"),
                    str(directory / "index.m3u8"),
                ]
            )
    return runs


def _hls_time(plan: Plan, rung: Rung) -> str:
    """``-hls_time`` for a rendition: the plan's segment, where its keyframes are; every
    keyframe for an AV1 rendition of a chunked plan, whose keyframes fall every GOP from
    each chunk's first frame (``av1.chunk_gop_frames``), not on the segment grid."""
    if rung.codec == "av1" and plan.chunking is not None:
        return f"{av1.EVERY_KEYFRAME_SECONDS:g}"
    return f"{plan.segment_seconds:g}"


def merge_runs(runs: list[list[str]]) -> list[str]:
    """Several runs of ``package_args`` (and ``poster_seek_args``) as one ffmpeg: each
    distinct input opened once (the source a remux packages twice, the audio file every
    rendition muxes; the poster's seeked opening is an input of its own), every output with
    its own options, its ``-map`` renumbered to the merged inputs. Copying and one seeked
    frame are cheap; starting a process per output was most of what they cost."""
    inputs: list[list[str]] = []
    outputs: list[str] = []
    for run in runs:
        if "-i" not in run:
            raise ValueError("a package run without an input")
        end = max(i for i, arg in enumerate(run) if arg == "-i") + 2
        numbers: list[int] = []
        start = 0
        for i in range(end):
            if run[i] == "-i":
                group = run[start : i + 2]
                if group not in inputs:
                    inputs.append(group)
                numbers.append(inputs.index(group))
                start = i + 2
        tail = run[end:]
        if "-map" not in tail:
            raise ValueError("a package run without -map would take streams of every input")
        # What ffmpeg takes from "the first input" by default (global metadata, chapters)
        # is named, so each output keeps its own run's first input's.
        outputs += ["-map_metadata", str(numbers[0]), "-map_chapters", str(numbers[0])]
        for i, arg in enumerate(tail):
            if i and tail[i - 1] == "-map":
                number, sep, rest = arg.partition(":")
                if not (sep and number.isdigit() and int(number) < len(numbers)):
                    raise ValueError(f"cannot renumber the map {arg!r}")
                arg = f"{numbers[int(number)]}:{rest}"
            outputs.append(arg)
    return [*(arg for group in inputs for arg in group), *outputs]


# The poster's JPEG quality (ffmpeg's -q:v, 2 the best but one), wherever it is made.
POSTER_JPEG_QUALITY = "2"

# The poster's opening reads this much of the source past its seek point, at most: merged
# with the playback's copy (``merge_runs``), an unbounded opening is decoded to the end of
# the file after its one frame was written (ffmpeg 5.1 keeps decoding an input while any
# output of the process is open), which cost a 1080p source a second of CPU for one JPEG.
POSTER_READ_FRAMES = 4
POSTER_READ_MIN_SECONDS = 0.25


def poster_read_seconds(plan: Plan) -> float:
    """How much of the source the poster's seeked opening reads: a few frames."""
    rate = plan.frame_rate if plan.frame_rate > 0 else 1.0
    return max(POSTER_READ_MIN_SECONDS, POSTER_READ_FRAMES / rate)


def poster_seek_args(
    plan: Plan, media: MediaConfig, sniff: Sniff, source: Path, layout: Layout
) -> list[str]:
    return [
        "-ss",
        f"{plan.poster_seconds:.3f}",
        "-t",
        f"{poster_read_seconds(plan):.3f}",
        *input_args(sniff, source, max_streams=media.max_streams, max_pixels=media.max_pixels),
        "-map",
        plan.video_map,
        "-frames:v",
        "1",
        "-q:v",
        POSTER_JPEG_QUALITY,
        "-update",
        "1",
        "-f",
        "image2",
        str(layout.poster),
    ]
