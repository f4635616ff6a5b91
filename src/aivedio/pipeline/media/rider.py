"""Outputs that ride along an encode pass's decode of the source (``Rider``)."""

from __future__ import annotations

from dataclasses import dataclass

# The label of the decoded video a ``Rider``'s graph is fed from.
RIDER_VIDEO = "[o_fm]"


@dataclass(frozen=True, slots=True)
class Rider:
    """Outputs that ride along an encode pass's decode of the source: a filter graph fed
    from ``RIDER_VIDEO`` (the video after the plan's frame-rate and colour filters) and
    the source's streams, its outputs, and whether the pass runs under ``-xerror`` (a decode
    error then fails it). The fast path's stills and decode check on a transcode
    (``pipeline/ffmpeg/frames.py``): the source decoded once for the playback and them."""

    graph: list[str]
    outputs: list[str]
    xerror: bool
