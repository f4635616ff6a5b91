"""Fetch attempts: one row per attempt of a provider output's fetch, for operators and the
status timeline (``store.asset_status``). Every call runs inside ``map_db_errors``."""

from __future__ import annotations

import uuid

from aivedio.store.database import Pool, map_db_errors
from aivedio.store.together import Part


def begin_after_move_part(output_id: uuid.UUID, job_id: int, attempt: int) -> Part:
    """An attempt's row, written only when the statement's ``move`` part won (it reads the
    move's answer); answers its id."""
    return Part(
        "INSERT INTO fetch_attempts (provider_output_id, job_id, attempt)"
        " SELECT $1, $2, $3 FROM move RETURNING id",
        (output_id, job_id, attempt),
        value="id",
    )


async def begin(pool: Pool, output_id: uuid.UUID, job_id: int, attempt: int) -> int:
    """An attempt's row; its id."""
    with map_db_errors("recording a fetch attempt"):
        attempt_id: int = await pool.fetchval(
            "INSERT INTO fetch_attempts (provider_output_id, job_id, attempt)"
            " VALUES ($1, $2, $3) RETURNING id",
            output_id,
            job_id,
            attempt,
        )
    return attempt_id


def end_part(
    attempt_id: int,
    outcome: str,
    *,
    error_class: str | None,
    error_detail: str | None,
    http_status: int | None,
    size_bytes: int | None,
    sha256: str | None,
    object_key: str | None,
    when: str = "true",
) -> Part:
    """An attempt's end: its outcome, the error it ended on, what it stored (``when``: a
    condition on the statement's earlier parts)."""
    return Part(
        "UPDATE fetch_attempts SET finished_at = now(), outcome = $2, error_class = $3,"
        " error_detail = $4, http_status = $5, bytes = $6, sha256 = $7, object_key = $8"
        f" WHERE id = $1 AND {when} RETURNING id",
        (
            attempt_id,
            outcome,
            error_class,
            error_detail,
            http_status,
            size_bytes,
            sha256,
            object_key,
        ),
    )


async def end(pool: Pool, part: Part) -> None:
    """Write an attempt's end (``end_part``) on its own."""
    with map_db_errors("recording a fetch attempt"):
        await pool.execute(part.sql, *part.args)
