"""The event stream's pure parts: the phase table, Last-Event-ID, the wire format, the hub."""

from __future__ import annotations

import dataclasses
import typing
import uuid
from datetime import UTC, datetime

import msgspec
import pytest

from aivedio.api import events
from aivedio.api.events import (
    PHASES,
    Hub,
    StageEvent,
    frame,
    parse_last_event_id,
    phase_of,
    stage_event,
)
from aivedio.states import TRANSITIONS, Entity, states
from aivedio.store.stage_events import MAX_EVENT_ID, Scope, StageRow

STREAMED = (Entity.GENERATION_TASK, Entity.PROVIDER_OUTPUT, Entity.ASSET)


@pytest.mark.parametrize("entity", STREAMED)
def test_every_state_has_exactly_one_phase(entity: Entity) -> None:
    assert set(PHASES[entity]) == states(entity)
    phases = set(typing.get_args(events.Phase))
    assert {phase for phase, _ in PHASES[entity].values()} <= phases


def test_failures_are_terminal_and_carry_their_error_class() -> None:
    for entity in STREAMED:
        for state, (phase, with_error) in PHASES[entity].items():
            if phase == "failed":
                assert with_error or entity is Entity.GENERATION_TASK, (entity, state)
                assert not TRANSITIONS[entity][state] - {"DELETED"}, (entity, state)


def test_the_happy_path_reads_as_the_page_shows_it() -> None:
    path = [
        (Entity.GENERATION_TASK, "PROVIDER_SUCCEEDED"),
        (Entity.PROVIDER_OUTPUT, "FETCHING"),
        (Entity.PROVIDER_OUTPUT, "STORED"),
        (Entity.ASSET, "PROCESSING"),
        (Entity.ASSET, "PLAYABLE"),
        (Entity.ASSET, "ENRICHED"),
    ]
    assert [phase_of(e, s)[0] for e, s in path] == [
        "generated",
        "receiving",
        "stored",
        "processing",
        "playable",
        "enriched",
    ]
    # A state the table does not know yet still streams, as in progress.
    assert phase_of(Entity.ASSET, "SOMETHING_NEW") == ("processing", True)


@pytest.mark.parametrize(
    ("header", "cursor"),
    [
        (None, 0),
        ("", 0),
        ("42", 42),
        (" 42 ", 42),
        ("0", 0),
        ("-1", 0),
        ("4.2", 0),
        ("1_000", 0),
        ("١٢", 0),
        ("abc", 0),
        ("9" * 30, MAX_EVENT_ID),
        ("9" * 41, 0),
    ],
)
def test_last_event_id(header: str | None, cursor: int) -> None:
    assert parse_last_event_id(header) == cursor


def test_wire_format_and_payload() -> None:
    scope = Scope(1, uuid.uuid4(), uuid.uuid4(), uuid.uuid4())
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    row = StageRow(
        id=7,
        entity="provider_output",
        state="RETRY_WAIT",
        asset_id=None,
        provider_output_id=scope.provider_output_id,
        generation_task_id=scope.generation_task_id,
        error_class="timeout",
        at=at,
    )
    wire = frame(stage_event(scope, row))
    assert wire.endswith(b"\n\n") and wire.count(b"\n") == 4
    head, kind, data = wire.split(b"\n")[:3]
    assert (head, kind) == (b"id: 7", b"event: stage")
    payload = msgspec.json.decode(data.removeprefix(b"data: "))
    assert payload == {
        "event_id": 7,
        "asset_id": str(scope.asset_id),
        "entity": "provider_output",
        "state": "RETRY_WAIT",
        "phase": "receiving",
        "at": "2025-01-02T03:04:05Z",
        "provider_output_id": str(scope.provider_output_id),
        "generation_task_id": str(scope.generation_task_id),
        "error_class": "timeout",
    }
    # A stale error class is not reported with a state that is not a failure.
    stored = dataclasses.replace(row, state="STORED")
    assert stage_event(scope, stored).error_class is None
    # An upload's asset: no output, no task, and the keys say so.
    upload = Scope(1, uuid.uuid4(), None, None)
    assert upload.keys == (upload.asset_id,)
    asset_row = StageRow(
        id=8,
        entity="asset",
        state="QUARANTINED",
        asset_id=upload.asset_id,
        provider_output_id=None,
        generation_task_id=None,
        error_class=None,
        at=at,
    )
    encoded = msgspec.json.decode(msgspec.json.encode(stage_event(upload, asset_row)))
    assert set(encoded) == {"event_id", "asset_id", "entity", "state", "phase", "at"}


def test_schema_and_paths() -> None:
    (_,), components = msgspec.json.schema_components([StageEvent])
    body = components["StageEvent"]
    assert set(body["required"]) == {"event_id", "asset_id", "entity", "state", "phase", "at"}
    assert "failed" in body["properties"]["phase"]["enum"]
    op = events.PATHS["/v1/assets/{asset_id}/events"]["get"]
    assert set(op["responses"]) == {"200", "401", "404", "503"}
    stage, progress = op["responses"]["200"]["content"]["text/event-stream"]["schema"]["oneOf"]
    assert stage["properties"]["data"]["contentSchema"] == {
        "$ref": "#/components/schemas/StageEvent"
    }
    # A progress event names its own schema and carries no id (Last-Event-ID stays).
    assert progress["properties"]["event"] == {"const": "progress"}
    assert progress["properties"]["data"]["contentSchema"] == {
        "$ref": "#/components/schemas/ProgressEvent"
    }
    assert "id" not in progress["required"]
    header = next(p for p in op["parameters"] if p["in"] == "header")
    assert (header["name"], header["required"], header["schema"]) == (
        "Last-Event-ID",
        False,
        {"type": "string"},
    )
    assert (StageEvent, events.ProgressEvent) == events.SCHEMAS


@pytest.mark.anyio
async def test_the_hub_rings_the_streams_of_the_changed_row() -> None:
    hub = Hub()
    a, b, task = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with hub.subscribe([a, task]) as first, hub.subscribe([b, task]) as second:
        hub.notify(str(a))
        assert await first.wait(0.01)
        assert not await second.wait(0.01)
        assert not await first.wait(0.01)  # rung once, heard once
        hub.notify(str(task))
        assert await first.wait(0.01) and await second.wait(0.01)
        hub.notify(str(uuid.uuid4()))
        assert not await first.wait(0.01)
        hub.wake_all()
        assert await first.wait(0.01) and await second.wait(0.01)
    assert hub._by_key == {}
    await hub.close()  # no stream open: returns at once
    assert hub.closing
