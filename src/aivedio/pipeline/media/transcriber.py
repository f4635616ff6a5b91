"""The seam for speech recognition: captions made from a video's own audio.

No recognizer runs here (no model can be fetched on these machines, and none is bundled),
so the one implementation is ``NullTranscriber``, which makes nothing. A real one (a local
Whisper, a vendor's speech API) implements ``Transcriber``: given the source and what the
probe found, it answers caption texts in the shape a provider reports them
(``providers.seam.ProviderCaption``: language, label, kind, WebVTT or SRT text), and they
become text tracks of the HLS output like every other caption text: cleaned by
``media/webvtt.py`` (a recognizer's output is text from outside too) and published with the
revision (``ffmpeg/source_tracks.py``), with ``origin`` ``transcriber``.

A transcriber is asked only when the source has no captions of its own (no subtitle stream,
none from the provider): it is the fallback, not a second opinion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from aivedio.pipeline.media.validate import MediaSummary
from aivedio.providers.seam import ProviderCaption


class Transcriber(Protocol):
    """Captions from a source's audio. Raises ``AivedioError`` when it fails (the video is
    published without them); answers an empty list when it has nothing to say."""

    name: str

    async def transcribe(self, source: Path, summary: MediaSummary) -> list[ProviderCaption]: ...


class NullTranscriber:
    """Makes no captions: the seam's stand-in while no recognizer is configured."""

    name = "none"

    async def transcribe(self, source: Path, summary: MediaSummary) -> list[ProviderCaption]:
        return []


NULL_TRANSCRIBER: Transcriber = NullTranscriber()
