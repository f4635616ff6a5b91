"""The pieces of a chunked revision and the jobs that make them: their names, the outputs
the chunked path makes, each step's deadline, job key and spec, and the first pieces a new
chunked revision starts with (``start``). The job bodies are ``chunk_stage``'s."""

from __future__ import annotations

import uuid

from aivedio.config.media import MediaConfig
from aivedio.pipeline import jobs
from aivedio.pipeline.media import av1
from aivedio.pipeline.media.chunks import CHUNK_OUTPUTS
from aivedio.pipeline.media.plan import Plan, Rung
from aivedio.store import media_pieces
from aivedio.store.media_pieces import SPLIT_PIECE
from aivedio.store.queue import JobSpec
from aivedio.store.together import Part

__all__ = ["SPLIT_PIECE"]

SPLIT_KIND = jobs.CHUNK_SPLIT.name
ENCODE_KIND = jobs.CHUNK_ENCODE.name
ASSEMBLE_KIND = jobs.CHUNK_ASSEMBLE.name
LANE = jobs.CHUNK_ENCODE.lane
AUDIO_PIECE = "audio"


def video_piece(rung: Rung | str, index: int) -> str:
    name = rung if isinstance(rung, str) else rung.name
    return f"video:{name}:{index:04d}"


def chunk_piece(index: int) -> str:
    return f"chunk:{index:04d}"


def chunk_outputs(plan: Plan) -> list[str]:
    """The outputs the chunked path makes for this plan (none on the single pass)."""
    if plan.chunking is None:
        return []
    return [o for o in CHUNK_OUTPUTS if o in plan.outputs]


def piece_timeout(plan: Plan, media_seconds: float, per_run: float, per_second: float) -> float:
    return (per_run + per_second * max(media_seconds, 0.0)) * 2 + 120


def video_piece_timeout(plan: Plan, media_seconds: float, media: MediaConfig) -> float:
    """A video piece's lease: two runs' budget and, when the plan has the AV1 ladder, the
    AV1 encode's extra wall time (the piece may be an AV1 one, and a first attempt encodes
    its chunk's AV1 pieces with its own)."""
    extra = av1.deadline_extra_seconds(media, media_seconds) if plan.av1_rungs else 0.0
    per_run, per_second = media.process_timeout_seconds, media.process_timeout_per_media_second
    return piece_timeout(plan, media_seconds, per_run, per_second) + extra


def piece_key(kind: str, asset_id: uuid.UUID, revision: int, plan: Plan, piece: str) -> str:
    return jobs.chunk_job_key(kind, asset_id, revision, piece, plan.pipeline_version)


def piece_spec(
    kind: str,
    asset_id: uuid.UUID,
    tenant_id: int,
    revision: int,
    plan: Plan,
    piece: str,
    timeout: float,
    *,
    later: float = 0.0,
) -> JobSpec:
    return jobs.chunk_spec(
        jobs.CONTRACTS[kind],
        asset_id,
        tenant_id,
        revision,
        piece,
        pipeline_version=plan.pipeline_version,
        timeout=timeout,
        later=later,
    )


def start(
    asset_id: uuid.UUID,
    tenant_id: int,
    revision: int,
    plan: Plan,
    per_run: float,
    per_second: float,
    *,
    when: str,
) -> tuple[Part, list[JobSpec]]:
    """For the statement that creates a chunked revision: its first pieces (the split, and
    the audio, which needs no chunk), written when ``when`` holds, and their jobs."""
    pieces = [SPLIT_PIECE] + ([AUDIO_PIECE] if plan.audio != "none" else [])
    part = media_pieces.insert_pending_part(asset_id, revision, pieces, when=when)
    whole = piece_timeout(plan, plan.duration_seconds, per_run, per_second)
    return part, [
        piece_spec(
            SPLIT_KIND if p == SPLIT_PIECE else ENCODE_KIND,
            asset_id,
            tenant_id,
            revision,
            plan,
            p,
            whole,
        )
        for p in pieces
    ]
