"""The transition table: exactly the listed moves are allowed, everything else is refused."""

from __future__ import annotations

import itertools

import pytest

from aivedio.errors import TransitionError
from aivedio.states import (
    INITIAL,
    LIVE_ASSET_STATES,
    TABLES,
    TERMINAL_OUTPUT_STATES,
    TRANSITIONS,
    Entity,
    allowed,
    states,
)
from aivedio.store.records import check_transition

ENTITIES = list(Entity)


def all_pairs(entity: Entity) -> list[tuple[str, str]]:
    return list(itertools.product(sorted(states(entity)), repeat=2))


def reachable(entity: Entity) -> set[str]:
    seen = set(INITIAL[entity])
    frontier = list(seen)
    while frontier:
        for nxt in TRANSITIONS[entity][frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return seen


def test_every_entity_has_a_table_and_initial_states() -> None:
    assert set(TRANSITIONS) == set(Entity)
    assert set(TABLES) == set(Entity)
    assert set(INITIAL) == set(Entity)


@pytest.mark.parametrize("entity", ENTITIES, ids=lambda e: e.value)
def test_targets_are_known_states(entity: Entity) -> None:
    for source, targets in TRANSITIONS[entity].items():
        assert targets <= states(entity), f"{source} -> {targets - states(entity)}"


@pytest.mark.parametrize("entity", ENTITIES, ids=lambda e: e.value)
def test_allowed_is_true_exactly_for_listed_pairs(entity: Entity) -> None:
    for current, new in all_pairs(entity):
        expected = new in TRANSITIONS[entity][current]
        assert allowed(entity, current, new) is expected, (current, new)


@pytest.mark.parametrize("entity", ENTITIES, ids=lambda e: e.value)
def test_check_transition_accepts_listed_and_refuses_every_other_pair(entity: Entity) -> None:
    refused = 0
    for current, new in all_pairs(entity):
        if new in TRANSITIONS[entity][current]:
            check_transition(entity, current, new)
        else:
            with pytest.raises(TransitionError, match="is not allowed"):
                check_transition(entity, current, new)
            refused += 1
    assert refused > 0


@pytest.mark.parametrize("entity", ENTITIES, ids=lambda e: e.value)
def test_no_state_may_move_to_itself(entity: Entity) -> None:
    for state in states(entity):
        assert not allowed(entity, state, state)


@pytest.mark.parametrize("entity", ENTITIES, ids=lambda e: e.value)
def test_unknown_states_are_refused(entity: Entity) -> None:
    some_state = sorted(states(entity))[0]
    assert not allowed(entity, "NO_SUCH_STATE", some_state)
    assert not allowed(entity, some_state, "NO_SUCH_STATE")
    with pytest.raises(TransitionError, match="unknown state"):
        check_transition(entity, "NO_SUCH_STATE", some_state)
    with pytest.raises(TransitionError):
        check_transition(entity, some_state, "NO_SUCH_STATE")
    with pytest.raises(TransitionError):
        check_transition(entity, some_state.lower(), some_state)


def test_states_are_entity_specific() -> None:
    # FAILED is a revision and variant state, never an asset state.
    with pytest.raises(TransitionError):
        check_transition(Entity.ASSET, "PROCESSING", "FAILED")
    with pytest.raises(TransitionError):
        check_transition(Entity.VARIANT, "PENDING", "PLAYABLE")


@pytest.mark.parametrize("entity", ENTITIES, ids=lambda e: e.value)
def test_every_state_is_reachable_from_an_initial_state(entity: Entity) -> None:
    assert INITIAL[entity] <= states(entity)
    assert reachable(entity) == states(entity)


def cycles_through(entity: Entity, removed: frozenset[str] = frozenset()) -> set[str]:
    """The states that can return to themselves once ``removed`` states are taken out."""
    table = {s: t - removed for s, t in TRANSITIONS[entity].items() if s not in removed}
    found = set()
    for start in table:
        frontier, seen = list(table[start]), set()
        while frontier:
            state = frontier.pop()
            if state == start:
                found.add(start)
                break
            if state not in seen:
                seen.add(state)
                frontier.extend(table[state])
    return found


@pytest.mark.parametrize(
    "entity", [e for e in ENTITIES if e is not Entity.PROVIDER_OUTPUT], ids=lambda e: e.value
)
def test_the_table_has_no_cycles(entity: Entity) -> None:
    # Without cycles a state can never return, so a CAS on the state alone is exact.
    assert cycles_through(entity) == set()


def test_provider_output_cycles_all_pass_through_an_attempt_or_a_refresh() -> None:
    # Retries loop back to FETCHING and refreshes through NEED_URL_REFRESH: a CAS on these
    # rows needs the version. Nothing else cycles.
    looping = cycles_through(Entity.PROVIDER_OUTPUT)
    assert looping == {"FETCHING", "FETCH_PENDING", "RETRY_WAIT", "NEED_URL_REFRESH"}
    without = frozenset({"FETCHING", "NEED_URL_REFRESH"})
    assert cycles_through(Entity.PROVIDER_OUTPUT, without) == set()


def test_provider_output_terminal_states() -> None:
    terminal = {s for s, t in TRANSITIONS[Entity.PROVIDER_OUTPUT].items() if not t}
    assert terminal == {"STORED", "OUTPUT_LOST", "INVALID_RESPONSE"}
    assert terminal == TERMINAL_OUTPUT_STATES


def test_every_waiting_output_state_can_be_lost() -> None:
    table = TRANSITIONS[Entity.PROVIDER_OUTPUT]
    for state in ("DISCOVERED", "FETCH_PENDING", "FETCHING", "RETRY_WAIT", "NEED_URL_REFRESH"):
        assert "OUTPUT_LOST" in table[state], state


def test_stored_output_cannot_be_fetched_again() -> None:
    for new in ("FETCH_PENDING", "FETCHING", "RETRY_WAIT", "OUTPUT_LOST"):
        with pytest.raises(TransitionError):
            check_transition(Entity.PROVIDER_OUTPUT, "STORED", new)


def test_asset_failure_states_are_distinct_and_there_is_no_generic_failed() -> None:
    asset_states = states(Entity.ASSET)
    failures = {"REJECTED", "INVALID_MEDIA", "PROCESSING_FAILED"}
    assert failures <= asset_states
    assert "FAILED" not in asset_states
    assert "OUTPUT_LOST" in states(Entity.PROVIDER_OUTPUT)
    assert len(failures | {"OUTPUT_LOST"}) == 4
    # Each failure has its own cause: the media's fault is INVALID_MEDIA (from probing);
    # anything else that ends processing is PROCESSING_FAILED (a probe out of retries too).
    assert allowed(Entity.ASSET, "PROBING", "INVALID_MEDIA")
    assert allowed(Entity.ASSET, "PROBING", "PROCESSING_FAILED")
    assert allowed(Entity.ASSET, "PROCESSING", "REJECTED")
    assert allowed(Entity.ASSET, "PROCESSING", "PROCESSING_FAILED")
    assert not allowed(Entity.ASSET, "PROCESSING", "INVALID_MEDIA")


def test_playable_cannot_go_back_to_processing_or_earlier() -> None:
    for earlier in ("PROCESSING", "PROBING", "QUARANTINED"):
        assert not allowed(Entity.ASSET, "PLAYABLE", earlier)
        with pytest.raises(TransitionError):
            check_transition(Entity.ASSET, "PLAYABLE", earlier)
    assert not allowed(Entity.ASSET, "ENRICHED", "PLAYABLE")


def test_nothing_leaves_deleted() -> None:
    assert TRANSITIONS[Entity.ASSET]["DELETED"] == frozenset()
    for new in states(Entity.ASSET):
        with pytest.raises(TransitionError):
            check_transition(Entity.ASSET, "DELETED", new)


def test_every_asset_state_except_deleted_can_be_deleted() -> None:
    for state in states(Entity.ASSET) - {"DELETED"}:
        assert allowed(Entity.ASSET, state, "DELETED"), state
    assert states(Entity.ASSET) >= LIVE_ASSET_STATES
    assert "DELETED" not in LIVE_ASSET_STATES
