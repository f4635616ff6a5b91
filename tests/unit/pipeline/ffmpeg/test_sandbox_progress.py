"""ffmpeg's ``-progress`` blocks however the pipe cuts them: the newest complete block of
each read reaches the result and the callback, exactly as written."""

from __future__ import annotations

import random

from aivedio.pipeline.ffmpeg.sandbox import RunResult, _Progress


def block(n: int, streams: int, last: bool = False) -> tuple[bytes, dict[str, str]]:
    fields = {"frame": str(n), "fps": "24.0"}
    fields |= {f"stream_{i}_0_q": f"{20 + i}.0" for i in range(streams)}
    fields |= {"out_time_us": str(n * 41666), "speed": "1.5x"}
    fields["progress"] = "end" if last else "continue"
    return "".join(f"{k}={v}\n" for k, v in fields.items()).encode(), fields


def run(chunks: list[bytes]) -> tuple[RunResult, list[dict[str, str]]]:
    result = RunResult(
        tool="ffmpeg", args=[], returncode=0, wall_seconds=0.0, network_isolated=False
    )
    seen: list[dict[str, str]] = []
    progress = _Progress(result, seen.append)
    for chunk in chunks:
        progress.feed(chunk)
    return result, seen


def test_each_block_read_alone_reaches_the_callback_whole() -> None:
    blocks = [block(n, streams=5, last=n == 9) for n in range(10)]
    result, seen = run([raw for raw, _ in blocks])
    assert seen == [fields for _, fields in blocks]
    assert result.progress == blocks[-1][1]


def test_blocks_cut_anywhere_give_the_newest_complete_one_of_each_read() -> None:
    blocks = [block(n, streams=3, last=n == 29) for n in range(30)]
    stream = b"".join(raw for raw, _ in blocks)
    ends = [sum(len(raw) for raw, _ in blocks[: i + 1]) for i in range(len(blocks))]
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 60)))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        result, seen = run(chunks)
        # After each read, the block that ended last by then (if a new one ended).
        wanted, done = [], 0
        for cut in [*cuts, len(stream)]:
            ended = sum(1 for end in ends if end <= cut)
            if ended > done:
                wanted.append(blocks[ended - 1][1])
                done = ended
        assert seen == wanted
        assert result.progress == blocks[-1][1]


def test_a_value_containing_progress_is_not_a_block_end() -> None:
    raw = b"frame=1\nencoder=progress=x\nprogress=continue\n"
    result, seen = run([raw[:20], raw[20:]])
    assert seen == [{"frame": "1", "encoder": "progress=x", "progress": "continue"}]
    assert result.progress == seen[0]


def test_noise_without_newlines_stays_bounded_and_blocks_after_it_still_parse() -> None:
    result = RunResult(
        tool="ffmpeg", args=[], returncode=0, wall_seconds=0.0, network_isolated=False
    )
    seen: list[dict[str, str]] = []
    progress = _Progress(result, seen.append)
    progress.feed(b"x" * 200_000)
    assert len(progress._buffer) <= 65536
    progress.feed(b"\n" + b"y" * 100 + b"\n" * 70_000)  # lines, but no block ends
    assert len(progress._lines) <= 65536 and seen == []
    progress.feed(block(1, 1)[0])
    assert seen == [block(1, 1)[1]] and result.progress == block(1, 1)[1]
