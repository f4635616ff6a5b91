"""``store.provider_outputs`` and ``store.fetch_attempts``: the parts intake and the fetch
stage write with others compose, and each waits for the part it reads."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from aivedio.store import fetch_attempts, generation_tasks, provider_outputs
from aivedio.store.together import together_sql


def test_a_new_tasks_output_waits_for_the_task() -> None:
    task, output = uuid.uuid4(), uuid.uuid4()
    inserted = provider_outputs.after("task")
    assert inserted == "EXISTS (SELECT 1 FROM task)"
    part = provider_outputs.insert_part(
        output, 1, task, "p", "t", 0, 1, b"blob", "k1", datetime.now(UTC), 10, "ab", None, inserted
    )
    assert f"WHERE {inserted} ON CONFLICT DO NOTHING RETURNING id" in part.sql
    assert part.value == "id"
    assert part.args[11:13] == ("sha256", "ab")
    unchecked = provider_outputs.insert_part(
        output, 1, task, "p", "t", 0, 1, b"blob", "k1", datetime.now(UTC), None, None, None, "true"
    )
    assert unchecked.args[11:13] == (None, None)
    together_sql(
        {
            "task": generation_tasks.new_succeeded_task_part(task, 1, "p", "t"),
            "output": part,
        }
    )


def test_the_stored_outputs_asset_and_attempt_wait_for_the_move() -> None:
    asset = provider_outputs.stored_asset_part(uuid.uuid4(), 1, uuid.uuid4(), "k", 3, "ab")
    assert "WHERE EXISTS (SELECT 1 FROM stored)" in asset.sql
    attempt = fetch_attempts.end_part(
        7,
        "stored",
        error_class=None,
        error_detail=None,
        http_status=None,
        size_bytes=3,
        sha256="ab",
        object_key="k",
        when=provider_outputs.after("stored"),
    )
    assert attempt.sql.endswith("WHERE id = $1 AND EXISTS (SELECT 1 FROM stored) RETURNING id")
    assert tuple(attempt.args) == (7, "stored", None, None, None, 3, "ab", "k")
    together_sql(
        {
            "task": provider_outputs.share_task_part(uuid.uuid4()),
            "asset": asset,
            "attempt": attempt,
        }
    )


def test_an_attempt_made_with_a_move_reads_the_moves_answer() -> None:
    part = fetch_attempts.begin_after_move_part(uuid.uuid4(), 5, 2)
    assert "SELECT $1, $2, $3 FROM move RETURNING id" in part.sql
    assert part.value == "id"
    together_sql({"attempt": part})
