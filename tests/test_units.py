"""Outbox, rate limiter, dedup, the memory broker's clock and the connection cap, without
sockets (the broker contract is tests/test_broker_contract.py)."""

from __future__ import annotations

import resource

import pytest

from app.access.ratelimit import RateLimiter, Verdict
from app.broker.dedup import RecentIds
from app.broker.memory import MemoryBroker
from app.errors import BrokerUnavailable
from app.ops.descriptors import connection_cap
from app.transport.outbox import Outbox
from tests.helpers import make_settings
from tests.test_broker_contract import Recorder


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


async def test_memory_broker_ids_increase_while_the_clock_stands_still() -> None:
    """Ids increase across rooms and calls even with a clock that stands still, and a broker
    that is not running refuses publishes."""
    broker = MemoryBroker(make_settings(), clock=lambda: 1000.0)
    with pytest.raises(BrokerUnavailable):
        await broker.publish("r", "u", "x", None)
    await broker.start(Recorder())
    ids = [(await broker.publish(room, "u", "x", None)).id for room in ("r", "s", "r", "s")]
    assert ids == sorted(ids) and len(set(ids)) == 4
    await broker.stop()
    assert not broker.ready


def test_connection_cap_keeps_headroom_below_the_descriptor_limit() -> None:
    """A worker holds at most 95 % of its descriptor limit (at least 64 kept free), never
    more than CHAT_MAX_CONNECTIONS, and any number under an unlimited descriptor limit."""
    assert connection_cap(20_000, 200_000) == 20_000
    assert connection_cap(20_000, 20_000) == 19_000
    assert connection_cap(20_000, 200) == 136
    assert connection_cap(20_000, 50) == 1  # nothing sensible fits: one socket, not zero
    assert connection_cap(20_000, resource.RLIM_INFINITY) == 20_000
