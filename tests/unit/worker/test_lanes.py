"""A lane's bookkeeping of notifications and claims (worker.lanes.Lane), without a database."""

from __future__ import annotations

from aivedio.worker.lanes import Lane, parse_notification


def test_notifications_name_a_lane_and_maybe_its_new_jobs() -> None:
    assert parse_notification("media") == ("media", None)
    assert parse_notification("control:17,18") == ("control", [17, 18])
    assert parse_notification("control:junk") == ("control", None)  # still news
    assert parse_notification(None) is None


def test_jobs_this_lane_already_claimed_are_not_news() -> None:
    lane = Lane("control", 4)
    lane.maybe_more = False
    lane.claiming = True
    assert not lane.claimed({5, 6})
    lane.hear([5, 6])  # the commit's notification, after the claim took both
    assert not lane.maybe_more and lane.news == 0
    lane.hear([6, 7])  # 7 is new
    assert lane.maybe_more and lane.news == 1


def test_ids_heard_during_a_claim_it_did_not_return_call_for_another() -> None:
    lane = Lane("control", 4)
    lane.claiming = True
    lane.hear([9])
    lane.hear([10])
    assert lane.news == 0  # held until the claim answers
    assert lane.claimed({9})  # 10 may have committed after the claim's snapshot
    lane.claiming = True
    lane.hear([11])
    assert not lane.claimed({11})
    assert lane.heard_in_claim == set() and not lane.claiming


def test_a_bare_notification_is_always_news() -> None:
    lane = Lane("media", 2)
    lane.maybe_more = False
    lane.claiming = True
    lane.hear(None)
    assert lane.maybe_more and lane.news == 1


def test_the_memory_of_claims_is_bounded() -> None:
    lane = Lane("fetch", 16)
    for start in range(0, 3000, 100):
        lane.claiming = True
        lane.claimed(set(range(start, start + 100)))
    assert len(lane.recent) <= 1024
    assert 2999 in lane.recent and 0 not in lane.recent


def test_nothing_waits_only_after_a_short_claim_and_until_news() -> None:
    lane = Lane("media", 2)
    assert not lane.nothing_waiting()  # a new lane has not looked yet
    lane.maybe_more = False  # a claim came back short
    assert lane.nothing_waiting()
    lane.hear(None)  # an enqueue for the lane
    assert not lane.nothing_waiting()
    lane.maybe_more = False
    lane.pledged = 1  # a job this worker enqueued for itself, not yet claimed
    assert not lane.nothing_waiting()
