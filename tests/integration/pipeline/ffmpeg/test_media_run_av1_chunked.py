"""A PQ (HDR10) source past the chunk threshold with ``[media.av1] hdr10``: the chunked path
makes the same renditions as a single pass would, the HDR10 one included (its branch leaves
each chunk's decode before the tone map), judged from the files with ffprobe: 10-bit PQ
BT.2020 with the source's mastering display in every chunk's part of the bitstream, the
SDR AV1 ladder tone-mapped, ``VIDEO-RANGE`` said, every AV1 rendition cut at the same
per-chunk keyframes."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from aivedio.config.media import AV1Config, MediaConfig, RungConfig
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import Report
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.media import av1, hls
from aivedio.pipeline.media.layout import Layout
from tests.support import media_fixtures as mf
from tests.support.hls_check import check_hls, parse_master, unquote

SECONDS = 8
MEDIA = MediaConfig(
    ladder=[RungConfig(height=240), RungConfig(height=144)],
    segment_seconds=1.0,
    chunk_threshold_seconds=4.0,
    chunk_seconds=2.0,
    x264_preset="ultrafast",
    av1=AV1Config(hdr10=True, preset=12),
)


def pq_source(directory: Path) -> Path:
    """320x240 10-bit HEVC tagged BT.2020 PQ with HDR10 metadata, 8 s, a closed GOP every
    36 frames (1.5 s: off the 1 s segment grid every other time), with a tone."""
    out = directory / "pq_chunkable.mp4"
    x265 = "log-level=error:keyint=36:min-keyint=36:scenecut=0:open-gop=0"
    x265 += f":hdr10=1:master-display={mf.MASTER_DISPLAY}:max-cll=1000,400"
    mf.run_ffmpeg(
        *("-f", "lavfi", "-i", f"testsrc2=s=320x240:r=24:d={SECONDS}"),
        *("-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={SECONDS}"),
        *("-map", "0:v", "-map", "1:a", "-c:v", "libx265", "-preset", "ultrafast"),
        *("-x265-params", x265, "-tag:v", "hvc1", "-pix_fmt", "yuv420p10le"),
        *("-color_primaries", "bt2020", "-color_trc", "smpte2084", "-colorspace", "bt2020nc"),
        *("-color_range", "tv", "-c:a", "aac", "-b:a", "64k"),
        str(out),
    )
    return out


def joined(directory: Path, scratch: Path) -> Path:
    playlist = hls.parse_media_playlist(directory / "index.m3u8")
    out = scratch / f"{directory.name}.mp4"
    with out.open("wb") as handle:
        for name in [playlist.init, *(uri for uri, _ in playlist.segments)]:
            handle.write((directory / name).read_bytes())
    return out


@pytest.mark.timeout(300)
def test_a_chunked_pq_source_gets_the_hdr10_rendition_from_its_chunks(tmp_path: Path) -> None:
    source = pq_source(tmp_path)
    root = tmp_path / "run"

    async def main() -> Report:
        run = MediaRun(Sandbox(MEDIA), source, root)
        run.av1 = True
        return await run.run(wants=["playback", "hls"])

    report = anyio.run(main)
    assert all(n.status == "done" for n in report.nodes.values()), report.failed()
    plan = report.plan
    assert plan is not None and plan.path == "chunked" and plan.chunking is not None
    assert plan.chunking.count >= 3
    hdr = plan.av1_rungs[-1]
    assert (hdr.name, hdr.dynamic_range) == ("av1_hdr10_240p", "pq")
    steps = [p.step for p in report.processes if p.step.startswith("encode[")]
    names = "+".join(r.name for r in plan.renditions)
    assert sorted(steps) == [f"encode[{names}:{i}]" for i in range(plan.chunking.count)]

    layout = Layout(root)
    master = layout.hls / "master.m3u8"
    # Every AV1 rendition, the HDR10 one too, cut at the same keyframes; all decode.
    assert check_hls(master, decode=True) == []
    listed = {
        entry["uri"].split("/")[0]: {k: unquote(v) for k, v in entry["attributes"].items()}
        for entry in parse_master(master)
        if entry["kind"] == "variant"
    }
    assert listed[hdr.name]["VIDEO-RANGE"] == "PQ"
    assert (listed[hdr.name]["CODECS"] or "").startswith("av01.0.00M.10.0.11")
    assert all(a["VIDEO-RANGE"] == "SDR" for name, a in listed.items() if name != hdr.name)

    whole = joined(layout.hls_rung(hdr), tmp_path)
    [stream] = mf.ffprobe_json(whole, "-select_streams", "v:0", "-show_streams")["streams"]
    assert stream["codec_name"] == "av1" and stream["pix_fmt"] == "yuv420p10le", stream
    colour = tuple(
        stream.get(k) for k in ("color_primaries", "color_transfer", "color_space", "color_range")
    )
    assert colour == ("bt2020", "smpte2084", "bt2020nc", "tv"), stream
    # Each chunk's encoder wrote the mastering display and light levels: the first frame of
    # every chunk carries them.
    frames = mf.ffprobe_json(whole, "-select_streams", "v:0", "-show_frames")["frames"]
    assert len(frames) == SECONDS * 24
    first = float(frames[0]["pts_time"])
    grid = av1.chunked_keyframes(plan.chunking, plan.frame_rate, plan.gop_frames)
    keys = [float(f["pts_time"]) - first for f in frames if f.get("key_frame") == 1]
    assert keys == pytest.approx(grid, abs=1e-3)
    for start in plan.chunking.grid_starts:
        frame = next(f for f in frames if abs(float(f["pts_time"]) - first - start) < 1e-3)
        side = {e["side_data_type"]: e for e in frame.get("side_data_list", [])}
        assert "Mastering display metadata" in side, (start, frame)
        light = side["Content light level metadata"]
        assert (light["max_content"], light["max_average"]) == (1000, 400)
    # The SDR AV1 ladder is tone-mapped and tagged BT.709.
    sdr = joined(layout.hls_rung(plan.av1_rungs[0]), tmp_path)
    [sdr_stream] = mf.ffprobe_json(sdr, "-select_streams", "v:0", "-show_streams")["streams"]
    assert sdr_stream["color_transfer"] == "bt709" and sdr_stream["pix_fmt"] == "yuv420p"
