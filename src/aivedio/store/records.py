"""State changes of records: the only way a status column changes.

``transition`` checks the move against the table in ``aivedio.states`` and then runs a
compare-and-set: ``UPDATE … WHERE key = $k AND status = $expected AND version = $v``. Zero
rows updated means someone else won the race: ``StaleStateError``, and the caller stops
instead of overwriting. Table and column names come from the fixed map in ``states.TABLES``,
never from input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aivedio.errors import StaleStateError, TransitionError
from aivedio.states import TABLES, TRANSITIONS, Entity, allowed
from aivedio.store.database import Connection, map_db_errors
from aivedio.store.together import Part

# Columns a transition may set besides the status; anything else is a programming error.
SETTABLE: Mapping[Entity, frozenset[str]] = {
    Entity.GENERATION_TASK: frozenset({"output_asset_id"}),
    Entity.PROVIDER_OUTPUT: frozenset(
        {
            "last_error_class",
            "last_error_detail",
            "source_url_ciphertext",
            "source_url_key_id",
            "source_url_expires_at",
            "descriptor_version",
        }
    ),
    Entity.ASSET: frozenset(
        {
            "last_error_class",
            "last_error_detail",
            "current_revision",
            "moderation_status",
            "probe",
            "provenance",
            "provenance_state",
            "media_type",
            "duration_us",
            "width",
            "height",
            "video_codec",
            "audio_codec",
            "frame_rate_num",
            "frame_rate_den",
            "source_size_bytes",
            "source_sha256",
            "source_object_key",
            "delete_version",
        }
    ),
    Entity.REVISION: frozenset(
        {
            "moderation_verdict",
            "moderation_version",
            "moderation_reasons",
            "published_at",
            "published_outputs",
            "plan",
        }
    ),
    Entity.VARIANT: frozenset(
        {
            "object_key",
            "mime_type",
            "size_bytes",
            "checksum",
            "width",
            "height",
            "bitrate",
            "codec",
            "extra",
            "completed_at",
        }
    ),
    Entity.PIECE: frozenset({"object_key", "size_bytes", "sha256", "frames", "detail"}),
}


def check_transition(entity: Entity, current: str, new: str) -> None:
    if current not in TRANSITIONS[entity]:
        raise TransitionError(f"{entity.value}: unknown state {current!r}")
    if not allowed(entity, current, new):
        raise TransitionError(f"{entity.value}: {current} -> {new} is not allowed")


async def transition(
    conn: Connection,
    entity: Entity,
    key: Sequence[Any],
    *,
    expected: str,
    new: str,
    version: int | None = None,
    values: Mapping[str, Any] | None = None,
) -> int:
    """Move one record from ``expected`` to ``new``; return its new version.

    ``version`` makes the CAS exact. Without it the expected state alone guards the change,
    which is enough only where a state cannot recur; provider outputs cycle through FETCHING
    (retries, refreshes), so their updates must pass ``version``.
    """
    part = transition_part(entity, key, expected=expected, new=new, version=version, values=values)
    with map_db_errors(f"changing {entity.value} state"):
        result = await conn.fetchval(part.sql, *part.args)
    if result is None:
        raise stale(entity, key, expected=expected, new=new, version=version)
    return int(result)


def transition_part(
    entity: Entity,
    key: Sequence[Any],
    *,
    expected: str,
    new: str,
    version: int | None = None,
    values: Mapping[str, Any] | None = None,
    when: str | None = None,
) -> Part:
    """The statement of ``transition``, checked against the table, for a caller that writes
    it together with others (``store.together``): it returns the new ``version`` (1 for a
    variant) from its one row, or no row when the CAS lost; then raise ``stale(…)``.
    ``when``: a condition on the statement's earlier parts, which it then reads first."""
    check_transition(entity, expected, new)
    table, status_column, key_columns = TABLES[entity]
    values = dict(values or {})
    unknown = set(values) - SETTABLE[entity]
    if unknown:
        raise TransitionError(f"{entity.value}: cannot set {sorted(unknown)} in a transition")
    has_version = entity is not Entity.VARIANT  # variants are insert-once rows
    params: list[Any] = [new, *key, expected]
    sets = [f"{status_column} = $1"]
    if has_version:
        sets.append("version = version + 1")
    if has_version:
        sets.append("updated_at = now()")
    for column, value in values.items():
        params.append(value)
        sets.append(f"{column} = ${len(params)}")
    where = [f"{col} = ${i + 2}" for i, col in enumerate(key_columns)]
    where.append(f"{status_column} = ${len(key_columns) + 2}")
    if version is not None:
        if not has_version:
            raise TransitionError(f"{entity.value} has no version column")
        params.append(version)
        where.append(f"version = ${len(params)}")
    if when is not None:
        where.append(when)
    returning = "version" if has_version else "1 AS version"
    sql = f"UPDATE {table} SET {', '.join(sets)} WHERE {' AND '.join(where)} RETURNING {returning}"
    return Part(sql, params, value="version")


def stale(
    entity: Entity, key: Sequence[Any], *, expected: str, new: str, version: int | None = None
) -> StaleStateError:
    """The error of a transition whose compare-and-set found the record moved on."""
    return StaleStateError(
        f"{entity.value} {'/'.join(map(str, key))}: expected {expected}"
        + (f" at version {version}" if version is not None else "")
        + f", found something else; not moving to {new}"
    )
