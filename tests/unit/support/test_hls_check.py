"""The HLS checker passes a real ffmpeg fMP4 ladder and names each thing broken in it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.hls_check import check_hls, parse_master, parse_media_playlist

RENDITIONS = (("v360", 640, 360), ("v240", 426, 240))


def encode_rendition(
    directory: Path,
    name: str,
    width: int,
    height: int,
    keyint: float,
    *,
    split_by_time: bool = False,
) -> None:
    """2 s of testsrc2 at 24 fps as an fMP4 VOD rendition with 1 s segments."""
    flags = "independent_segments" + ("+split_by_time" if split_by_time else "")
    subprocess.run(
        [
            *("ffmpeg", "-nostdin", "-hide_banner", "-v", "error", "-y"),
            *("-f", "lavfi", "-i", "testsrc2=s=640x360:r=24:d=2"),
            *("-vf", f"scale={width}:{height}", "-c:v", "libx264", "-preset", "ultrafast"),
            *("-pix_fmt", "yuv420p", "-sc_threshold", "0"),
            *("-force_key_frames", f"expr:gte(t,n_forced*{keyint})"),
            *("-f", "hls", "-hls_time", "1", "-hls_segment_type", "fmp4"),
            *("-hls_playlist_type", "vod", "-hls_flags", flags),
            *("-hls_fmp4_init_filename", f"init_{name}.mp4"),
            *("-hls_segment_filename", str(directory / f"{name}_%03d.m4s")),
            str(directory / f"{name}.m3u8"),
        ],
        check=True,
        capture_output=True,
    )


def write_master(directory: Path, *, codecs: bool = True) -> Path:
    lines = ["#EXTM3U", "#EXT-X-VERSION:7", "#EXT-X-INDEPENDENT-SEGMENTS"]
    for name, width, height in RENDITIONS:
        attributes = f"BANDWIDTH={width * 2000},RESOLUTION={width}x{height}"
        if codecs:
            attributes += ',CODECS="avc1.42c01e"'
        attributes += ",FRAME-RATE=24.000"
        lines += [f"#EXT-X-STREAM-INF:{attributes}", f"{name}.m3u8"]
    master = directory / "master.m3u8"
    master.write_text("\n".join(lines) + "\n")
    return master


def make_ladder(directory: Path, *, second_keyint: float = 1.0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for (name, width, height), keyint in zip(RENDITIONS, (1.0, second_keyint), strict=True):
        encode_rendition(directory, name, width, height, keyint)
    return write_master(directory)


@pytest.fixture(scope="module")
def good_ladder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ladder(tmp_path_factory.mktemp("ladder"))


@pytest.fixture
def ladder(good_ladder: Path, tmp_path: Path) -> Path:
    """A private copy of the good ladder, to break."""
    copy = tmp_path / "ladder"
    shutil.copytree(good_ladder.parent, copy)
    return copy / "master.m3u8"


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, text
    path.write_text(text.replace(old, new, count))


def one_problem_matching(problems: list[str], pattern: str) -> str:
    matching = [p for p in problems if re.search(pattern, p)]
    assert matching, problems
    return matching[0]


# -- the good ladder --------------------------------------------------------------------------


def test_good_ladder_passes(good_ladder: Path) -> None:
    assert check_hls(good_ladder) == []


def test_parse_master(good_ladder: Path) -> None:
    variants = parse_master(good_ladder)
    assert [v["uri"] for v in variants] == ["v360.m3u8", "v240.m3u8"]
    assert variants[0]["attributes"]["RESOLUTION"] == "640x360"
    assert variants[0]["attributes"]["CODECS"] == '"avc1.42c01e"'


def test_parse_media_playlist(good_ladder: Path) -> None:
    playlist = parse_media_playlist(good_ladder.parent / "v240.m3u8")
    assert playlist["target_duration"] == 1
    assert playlist["version"] == 7
    assert playlist["map_uri"] == "init_v240.mp4"
    assert playlist["endlist"] is True
    assert playlist["syntax"] == []
    assert [s["uri"] for s in playlist["segments"]] == ["v240_000.m4s", "v240_001.m4s"]
    assert [s["duration"] for s in playlist["segments"]] == [1.0, 1.0]


# -- each break is named ----------------------------------------------------------------------


def test_deleted_segment(ladder: Path) -> None:
    (ladder.parent / "v240_001.m4s").unlink()
    problems = check_hls(ladder)
    one_problem_matching(problems, r"v240\.m3u8: segment v240_001\.m4s missing")


def test_empty_segment(ladder: Path) -> None:
    (ladder.parent / "v360_000.m4s").write_bytes(b"")
    one_problem_matching(check_hls(ladder), r"v360\.m3u8: segment v360_000\.m4s is empty")


def test_deleted_init(ladder: Path) -> None:
    (ladder.parent / "init_v360.mp4").unlink()
    problems = check_hls(ladder)
    one_problem_matching(problems, r"v360\.m3u8: init init_v360\.mp4 missing")


def test_missing_map(ladder: Path) -> None:
    edit(ladder.parent / "v360.m3u8", '#EXT-X-MAP:URI="init_v360.mp4"\n', "")
    one_problem_matching(check_hls(ladder), r"v360\.m3u8: #EXT-X-MAP .*missing")


def test_missing_endlist(ladder: Path) -> None:
    edit(ladder.parent / "v240.m3u8", "#EXT-X-ENDLIST\n", "")
    problems = check_hls(ladder)
    assert problems == ["v240.m3u8: #EXT-X-ENDLIST missing"]


def test_extinf_above_target(ladder: Path) -> None:
    edit(ladder.parent / "v360.m3u8", "#EXTINF:1.000000,", "#EXTINF:1.600000,")
    problems = check_hls(ladder)
    one_problem_matching(problems, r"v360\.m3u8: #EXTINF 1\.6 for v360_000\.m4s exceeds")


def test_extinf_rounding_to_the_target_is_allowed(ladder: Path) -> None:
    edit(ladder.parent / "v360.m3u8", "#EXTINF:1.000000,", "#EXTINF:1.400000,")
    assert check_hls(ladder, decode=False) == []


def test_master_without_codecs(ladder: Path) -> None:
    write_master(ladder.parent, codecs=False)
    problems = check_hls(ladder)
    assert len(problems) == 2
    one_problem_matching(problems, r"variant 0 \(v360\.m3u8\): CODECS missing")
    one_problem_matching(problems, r"variant 1 \(v240\.m3u8\): CODECS missing")


def test_master_attribute_values(ladder: Path) -> None:
    ladder.write_text(
        "#EXTM3U\n"
        "#EXT-X-STREAM-INF:BANDWIDTH=0,RESOLUTION=640,CODECS=avc1,FRAME-RATE=x\n"
        "v360.m3u8\n"
    )
    problems = check_hls(ladder, decode=False)
    for name in ("BANDWIDTH", "RESOLUTION", "CODECS", "FRAME-RATE"):
        one_problem_matching(problems, rf"variant 0 \(v360\.m3u8\): {name} ")


def test_master_points_at_a_missing_playlist(ladder: Path) -> None:
    (ladder.parent / "v240.m3u8").unlink()
    one_problem_matching(check_hls(ladder), r"media playlist v240\.m3u8 missing")


def test_stream_inf_without_uri(ladder: Path) -> None:
    edit(ladder, "v240.m3u8\n", "")
    one_problem_matching(check_hls(ladder, decode=False), r"no media playlist URI")


@pytest.mark.parametrize("uri", ["/etc/passwd", "../v240_000.m4s", "file:///etc/passwd"])
def test_unsafe_segment_uris(ladder: Path, uri: str) -> None:
    edit(ladder.parent / "v240.m3u8", "v240_001.m4s", uri)
    problems = check_hls(ladder, decode=False)
    one_problem_matching(
        problems, rf"v240\.m3u8: segment URI '{re.escape(uri)}' (is absolute|contains)"
    )


def test_unsafe_variant_uri(ladder: Path) -> None:
    edit(ladder, "v240.m3u8", "../ladder/v240.m3u8")
    one_problem_matching(check_hls(ladder, decode=False), r"URI '\.\./ladder/v240\.m3u8' contains")


def test_segment_not_starting_with_a_keyframe(ladder: Path) -> None:
    # One keyframe only, and split_by_time lets the muxer cut at 1 s anyway: on a P frame.
    encode_rendition(ladder.parent, "v240", 426, 240, keyint=100.0, split_by_time=True)
    problems = check_hls(ladder)
    assert problems == ["v240.m3u8: segment v240_001.m4s does not start with a keyframe"]


def test_misaligned_renditions(tmp_path: Path) -> None:
    master = make_ladder(tmp_path / "misaligned", second_keyint=0.7)
    problems = check_hls(master, decode=False)
    one_problem_matching(problems, r"misaligned.*v360\.m3u8.*v240\.m3u8")


def test_decode_catches_a_corrupted_segment(ladder: Path) -> None:
    segment = ladder.parent / "v360_001.m4s"
    data = bytearray(segment.read_bytes())
    start = len(data) // 2
    data[start:] = bytes((i * 97 + 13) % 256 for i in range(len(data) - start))
    segment.write_bytes(bytes(data))
    assert check_hls(ladder, decode=False) == []
    one_problem_matching(check_hls(ladder), r"v360\.m3u8: decode exit")


# -- bad input never raises -------------------------------------------------------------------


def test_missing_master(tmp_path: Path) -> None:
    assert check_hls(tmp_path / "absent.m3u8") == ["absent.m3u8: missing"]


@pytest.mark.parametrize(
    "content", [b"", b"\xff\xfe\x00garbage", b"<html>403</html>", b"#EXTM3U\n"]
)
def test_garbage_master(tmp_path: Path, content: bytes) -> None:
    master = tmp_path / "master.m3u8"
    master.write_bytes(content)
    problems = check_hls(master)
    assert problems
    assert all(p.startswith("master.m3u8") for p in problems)


def test_garbage_media_playlist(ladder: Path) -> None:
    (ladder.parent / "v240.m3u8").write_text(
        "#EXTM3U\n#EXT-X-TARGETDURATION:one\n#EXTINF:abc,\nv240_000.m4s\n#EXTINF:1,\n"
    )
    problems = check_hls(ladder)
    for pattern in (
        r"bad #EXT-X-TARGETDURATION",
        r"bad #EXTINF duration 'abc'",
        r"#EXTINF without a segment URI",
        r"#EXT-X-VERSION missing",
        r"#EXT-X-MAP .*missing",
        r"#EXT-X-ENDLIST missing",
    ):
        one_problem_matching(problems, rf"v240\.m3u8: .*{pattern}")
