"""``store.publishing``: the parts of the release statement compose as ``write_together``
parts, and the checks wait for what they read."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from aivedio.store import publishing
from aivedio.store.together import Part, together_sql

ASSET = uuid.uuid4()


def test_the_publish_statement_composes_with_its_checks_reading_the_lock() -> None:
    parts: dict[str, Part] = {
        "lock": publishing.lock_part(ASSET),
        "fresh": publishing.versions_check(1, 0),
        "pointer": publishing.pointer_check(None),
        "asset": publishing.move_pointer_part(ASSET, 2, 1, when=publishing.after("pointer")),
        "release": publishing.release_part(ASSET, 2, 1, ["playback"]),
        "link": publishing.link_task_part(ASSET),
        "won": publishing.won_check(with_previous=True),
        "switched": publishing.switched_check(),
    }
    sql, args = together_sql(parts)
    assert "FROM lock" in parts["fresh"].sql and "FROM lock" in parts["pointer"].sql
    assert "AND EXISTS (SELECT 1 FROM pointer) RETURNING 1" in parts["asset"].sql
    assert "(SELECT count(*) FROM previous) = 1" in parts["won"].sql
    assert "FROM previous" not in publishing.won_check(with_previous=False).sql
    assert len(args) == sum(len(p.args) for p in parts.values())
    assert sql.startswith("WITH lock AS (")


def test_a_pointer_move_without_a_condition_is_unconditional() -> None:
    assert " AND true RETURNING 1" in publishing.move_pointer_part(ASSET, 2, None, when=None).sql


def test_an_enrichments_copy_waits_for_the_named_check() -> None:
    at = datetime.now(UTC)
    copy = publishing.copy_parts(ASSET, 3, 2, ["hls"], at, after_part="no_rebuild")
    assert list(copy) == ["ready", "outputs"]  # the copy is the release's READY revision
    for part in copy.values():
        assert "AND EXISTS (SELECT 1 FROM no_rebuild) RETURNING 1" in part.sql
    assert tuple(copy["ready"].args) == (ASSET, 3, 2, 2, at, ["hls"])  # from 2, enriching 2
    assert "'READY'" in copy["ready"].sql
    assert tuple(copy["outputs"].args) == (ASSET, 3, 2, ["hls"])
    together_sql(
        {
            "lock": publishing.lock_part(ASSET),
            "current": publishing.current_check(2),
            "not_deleted": publishing.not_deleted_check(0),
            "not_cancelled": publishing.not_cancelled_check(0),
            "no_rebuild": publishing.no_rebuild_check(ASSET, 2),
            **copy,
        }
    )


def test_each_check_raises_its_own_code() -> None:
    codes = {
        publishing.versions_check(0, 0): publishing.GONE,
        publishing.pointer_check(1): publishing.MOVED,
        publishing.won_check(with_previous=False): publishing.STALE,
        publishing.switched_check(): publishing.SHIFTED,
        publishing.current_check(1): publishing.NOT_CURRENT,
        publishing.not_deleted_check(0): publishing.DELETED,
        publishing.not_cancelled_check(0): publishing.CANCELLED,
        publishing.no_rebuild_check(ASSET, 1): publishing.REBUILDING,
    }
    assert len(set(codes.values())) == len(codes)
    for part, code in codes.items():
        assert f"'{code}'" in part.sql
