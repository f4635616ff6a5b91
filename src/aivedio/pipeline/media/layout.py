"""Where things live in a job's scratch directory: ``work/`` for intermediates (rung videos,
the audio, the PCM, chunk pieces) and ``out/``, which mirrors the object keys of what is
published. The argv builders (``ffmpeg_args``) name these paths and never make them."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from aivedio.pipeline.media.plan import Plan, Rung


@dataclass(frozen=True, slots=True)
class Layout:
    """Where things live in a job's scratch directory (``out/`` mirrors the object keys)."""

    root: Path
    # Made once: every path of a render's argv and checks is under one of the two.
    work: Path = field(init=False, repr=False)
    out: Path = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "work", self.root / "work")
        object.__setattr__(self, "out", self.root / "out")

    def rung_video(self, rung: Rung) -> Path:
        return self.work / f"rung_{rung.name}.mp4"

    @property
    def proxy_video(self) -> Path:
        return self.work / "proxy_video.mp4"

    @property
    def audio(self) -> Path:
        return self.work / "audio.m4a"

    @property
    def pcm(self) -> Path:
        return self.work / "waveform.pcm"

    @property
    def playback(self) -> Path:
        return self.out / "playback.mp4"

    @property
    def proxy(self) -> Path:
        return self.out / "proxy.mp4"

    @property
    def poster(self) -> Path:
        return self.out / "poster.jpg"

    @property
    def sprites(self) -> Path:
        return self.out / "sprites"

    @property
    def waveform(self) -> Path:
        return self.out / "waveform"

    @property
    def hls(self) -> Path:
        return self.out / "hls"

    def hls_rung(self, rung: Rung) -> Path:
        return self.hls / rung.name

    @property
    def keyframes(self) -> Path:
        return self.out / "keyframes.json"

    def make_dirs(self, plan: Plan | None = None, wants: Collection[str] | None = None) -> None:
        """The directories the argv of this module writes into for ``wants`` (every output
        when None; ``work/``, the processes' cwd, always): the builders stay pure. A probe
        wants nothing and gets ``work/`` alone: each directory made and removed again costs
        the worker a tenth of a millisecond on ext4."""
        paths = [self.work]
        if wants is None or wants:
            paths.append(self.out)
        if wants is None or "sprite" in wants:
            paths.append(self.sprites)
        if wants is None or "waveform" in wants:
            paths.append(self.waveform)
        if plan is not None and (wants is None or "hls" in wants):
            paths += [self.hls_rung(rung) for rung in plan.renditions]
        for path in paths:
            path.mkdir(parents=True, exist_ok=True)
