"""Outbox, rate limiter, dedup and the memory broker, without sockets."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from app.access.ratelimit import RateLimiter, Verdict
from app.broker import History
from app.broker.dedup import RecentIds
from app.broker.memory import MemoryBroker
from app.errors import BrokerUnavailable
from app.transport.outbox import Outbox
from tests.helpers import make_settings


def test_outbox_refuses_past_its_byte_bound() -> None:
    """The outbox holds at most max_bytes; the frame that would overflow is refused."""
    box = Outbox(max_bytes=10, coalesce_max_bytes=100)
    assert box.put("aaaa", 4) and box.put("bbbb", 4)
    assert not box.put("cc", 2 + 1)
    assert box.queued_bytes == 8 and len(box) == 2


def test_outbox_coalesces_in_order_up_to_limit() -> None:
    """take() joins queued frames with newlines, in order, without exceeding the limit."""
    box = Outbox(max_bytes=1000, coalesce_max_bytes=11)
    for frame in ("a1", "b2", "c3", "d4", "e5"):
        box.put(frame, 2)
    assert box.take() == "a1\nb2\nc3\nd4"  # 4*2 + 3 separators = 11 bytes
    assert box.take() == "e5"
    assert not box and box.queued_bytes == 0


def test_outbox_large_frame_goes_alone() -> None:
    """A frame larger than the coalescing limit is sent on its own, not split or refused."""
    box = Outbox(max_bytes=1000, coalesce_max_bytes=8)
    box.put("x" * 20, 20)
    box.put("y", 1)
    assert box.take() == "x" * 20
    assert box.take() == "y"


def test_rate_limiter_bucket_and_abuse() -> None:
    """Burst frames pass, then frames are limited; refills at the rate; too many refusals
    within the window is abuse, and a new window starts afresh."""
    limiter = RateLimiter(rate_per_s=2.0, burst=3, max_violations=2, window_s=10.0, now=0.0)
    assert [limiter.check(0.0) for _ in range(3)] == [Verdict.ALLOW] * 3
    assert limiter.check(0.0) is Verdict.LIMITED
    assert limiter.check(0.1) is Verdict.LIMITED
    assert limiter.check(0.2) is Verdict.ABUSE
    assert limiter.check(0.8) is Verdict.ALLOW  # 0.6 s at 2/s refilled one token
    later = RateLimiter(rate_per_s=1.0, burst=1, max_violations=1, window_s=1.0, now=0.0)
    assert later.check(0.0) is Verdict.ALLOW
    assert later.check(0.1) is Verdict.LIMITED
    assert later.check(5.0) is Verdict.ALLOW
    assert later.check(5.0) is Verdict.LIMITED  # window restarted: one refusal is tolerated


def test_recent_ids_expire_and_are_bounded() -> None:
    """Entries expire after the TTL and the oldest go first past max_entries."""
    recent = RecentIds(ttl_s=10.0, max_entries=2)
    recent.add("a", 1, now=0.0)
    recent.add("b", 2, now=1.0)
    assert recent.get("a", now=5.0) == 1
    recent.add("c", 3, now=2.0)
    assert recent.get("a", now=5.0) is None and len(recent) == 2
    assert recent.get("b", now=11.5) is None  # expired
    assert recent.get("c", now=11.5) == 3


class _Recorder:
    """A BrokerHandler that records what it is given."""

    def __init__(self) -> None:
        self.rooms: list[tuple[str, bytes]] = []
        self.users: list[tuple[str, bytes]] = []

    def deliver_room(self, room: str, payload: bytes) -> None:
        self.rooms.append((room, payload))

    def deliver_user(self, user: str, payload: bytes) -> None:
        self.users.append((user, payload))

    def link_lost(self) -> None:
        raise AssertionError("the memory broker never loses its subscriptions")

    def resubscribed(self) -> None:
        raise AssertionError("the memory broker never loses its subscriptions")

    def kick(self, user: str, reason: str, issued_at: float | None = None) -> None:
        self.users.append((user, reason.encode()))


async def test_memory_broker_ids_order_and_dedup() -> None:
    """Ids increase across rooms and calls, even with a clock that stands still; a repeated
    cid returns the first id and is not delivered; unsubscribed rooms are not delivered."""
    recorder = _Recorder()
    broker = MemoryBroker(make_settings(dedup_ttl_s=60), clock=lambda: 1000.0)
    with pytest.raises(BrokerUnavailable):
        await broker.publish("r", "u", "x", None)
    await broker.start(recorder)
    await broker.subscribe_room("r")
    first = await broker.publish("r", "u", "a", "c1")
    second = await broker.publish("other", "u", "b", None)
    again = await broker.publish("r", "u", "a", "c1")
    third = await broker.publish("r", "u", "c", "c1-other-user-same-cid")
    assert first.id < second.id < third.id
    assert again.duplicate and again.id == first.id
    assert [room for room, _ in recorder.rooms] == ["r", "r"]
    await broker.unsubscribe_room("r")
    await broker.publish("r", "u", "d", None)
    assert len(recorder.rooms) == 2
    await broker.stop()
    assert not broker.ready


async def test_memory_broker_history_and_recovery_limits() -> None:
    """History keeps the newest history_size messages; since older than that, or more missed
    than recovery_max_messages, is not recovered; a since from the future neither."""
    broker = MemoryBroker(make_settings(history_size=5, recovery_max_messages=3))
    await broker.start(_Recorder())
    ids = [(await broker.publish("r", "u", str(n), None)).id for n in range(8)]
    recent = await broker.history_since("r", ids[5], 100)
    assert recent.recovered and [orjson.loads(f)["text"] for f in recent.frames] == ["6", "7"]
    assert not (await broker.history_since("r", ids[3], 100)).recovered  # 4 missed > 3
    assert not (await broker.history_since("r", ids[1], 100)).recovered  # trimmed away
    assert not (await broker.history_since("r", ids[-1] + 1, 100)).recovered
    assert (await broker.history_since("r", ids[-1], 100)) == History(True, [])
    page = await broker.history_before("r", ids[7], 2)
    assert [orjson.loads(f)["text"] for f in page] == ["5", "6"]


async def test_big_room_presence_is_throttled() -> None:
    """Above presence_max_members, joins are announced as counts, at most once per interval,
    with one trailing update carrying the final count: no N² storm when a room fills up."""
    recorder = _Recorder()
    broker = MemoryBroker(make_settings(presence_max_members=3, presence_count_interval_s=0.2))
    await broker.start(recorder)
    await broker.subscribe_room("big")
    for n in range(200):
        await broker.presence_join("big", f"u{n}")
    frames = [orjson.loads(p) for _, p in recorder.rooms]
    assert [f.get("user") for f in frames[:3]] == ["u0", "u1", "u2"]  # small: by name
    assert len(frames) == 4 and frames[3] == {"type": "presence", "room": "big", "count": 4}
    await asyncio.sleep(0.35)  # the trailing update
    assert len(recorder.rooms) == 5
    assert orjson.loads(recorder.rooms[-1][1]) == {"type": "presence", "room": "big", "count": 200}
    await broker.stop()
