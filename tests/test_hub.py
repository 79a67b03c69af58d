"""The Hub's join buffering and catch-up, without a server: a real Hub, memory broker and
memory presence, real Connections over a socket stand-in that records what they are sent.

A join replays from history while live messages keep arriving; these tests hold the history
fetch open (:class:`GatedBroker`) to make live messages arrive mid-replay, and check that
each connection ends up with every message after its ``since``, once, in id order, and live.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import orjson
import pytest
from starlette.websockets import WebSocket

from app.access.ratelimit import RateLimiter
from app.broker import History
from app.broker.memory import MemoryBroker
from app.ops.metrics import Metrics
from app.presence.memory import MemoryPresence
from app.settings import Settings
from app.sockets.connection import Connection
from app.sockets.hub import Hub
from app.sockets.replay import Pacing
from app.transport.flusher import Flusher
from app.transport.outbox import Outbox
from tests.helpers import make_settings, wait_until


class GatedBroker(MemoryBroker):
    """The memory broker, whose history reads are answered only while :attr:`gate` is
    open."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.gate = asyncio.Event()
        self.gate.set()
        self.reads = 0
        self.last_ids = 0  # last_id calls
        self.last_gate = asyncio.Event()  # last_id answers wait for it (read when called)
        self.last_gate.set()

    async def last_id(self, room: str) -> int:
        self.last_ids += 1
        newest = await super().last_id(room)
        await self.last_gate.wait()
        return newest

    async def history_since(self, room: str, since: int, limit: int) -> History:
        # Read now, answer later: like a Redis reply still on its way (the script ran when
        # called), so messages published meanwhile are not in this page.
        page = await super().history_since(room, since, limit)
        self.reads += 1
        await self.gate.wait()
        return page


class RecordingSocket:
    """Stands in for Starlette's WebSocket: records the frames a Connection writes."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.closed: int | None = None

    async def send_text(self, text: str) -> None:
        self.frames.extend(orjson.loads(line) for line in text.split("\n"))

    async def close(self, code: int, reason: str) -> None:
        self.closed = code

    def ids(self, room: str = "r") -> list[int]:
        return [f["id"] for f in self.frames if f["type"] == "message" and f.get("room") == room]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == kind]


class World:
    def __init__(self, hub: Hub, broker: GatedBroker, settings: Settings) -> None:
        self.hub = hub
        self.broker = broker
        self.settings = settings
        self.flusher = Flusher()

    def connect(self, user: str) -> tuple[Connection, RecordingSocket]:
        socket = RecordingSocket()
        settings, now = self.settings, time.monotonic()
        conn = Connection(
            cast(WebSocket, socket),
            user,
            Outbox(settings.outbox_max_bytes, settings.coalesce_max_bytes, self.hub.outbox_budget),
            RateLimiter(1000.0, 1000, 10, 10.0, now),
            settings.close_timeout_s,
            now,
            self.hub._metrics,
            self.flusher,
        )
        assert self.hub.add(conn)
        conn.greeted = True  # as the session does once `hello` is queued
        return conn, socket

    async def say(self, text: str, room: str = "r") -> int:
        return (await self.broker.publish(room, "talker", text, None)).id


@pytest.fixture
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    overrides = dict(getattr(request, "param", {}))
    buffer = overrides.pop("buffer", None)
    newest_known_for_s = overrides.pop("newest_known_for_s", 3600.0)  # as main.py sets it
    settings = make_settings(**overrides)
    broker = GatedBroker(settings)
    presence = MemoryPresence(settings, broker)
    pacing = Pacing.of(settings)
    if buffer is not None:
        pacing = Pacing(pacing.budget, pacing.page, buffer)
    hub = Hub(broker, presence, 5000, Metrics(), pacing, newest_known_for_s=newest_known_for_s)
    await broker.start(hub)
    world = World(hub, broker, settings)
    try:
        yield world
    finally:
        await hub.close()
        await presence.stop()
        await broker.stop()


async def test_a_join_with_since_replays_then_goes_live_without_gap_or_duplicate(
    world: World,
) -> None:
    """Messages published while the join's history read is under way are held, and follow
    the replayed ones: every message after `since`, once, in order."""
    missed = [await world.say(f"m{n}") for n in range(5)]
    conn, socket = world.connect("ada")
    world.broker.gate.clear()
    joining = asyncio.create_task(world.hub.join(conn, "r", missed[1]))
    await wait_until(lambda: world.broker.reads == 1)
    live = [await world.say(f"l{n}") for n in range(3)]  # heard while the read waits
    world.broker.gate.set()
    await joining
    await wait_until(lambda: len(socket.ids()) == 6)
    assert socket.ids() == missed[2:] + live
    assert socket.of_type("joined")[0]["recovered"] is True
    assert world.hub.behind("r") == 0  # live now
    later = await world.say("after")
    await wait_until(lambda: socket.ids()[-1:] == [later])
    assert socket.ids() == missed[2:] + live + [later]


async def test_a_join_without_since_gets_everything_after_its_last(world: World) -> None:
    """`joined.last` is the newest id at the join: the client gets every message after it,
    and nothing before."""
    old = await world.say("old")
    conn, socket = world.connect("ada")
    await world.hub.join(conn, "r", None)
    await wait_until(lambda: bool(socket.of_type("joined")))
    last = socket.of_type("joined")[0]["last"]
    assert last == old
    new = [await world.say(f"n{n}") for n in range(3)]
    await wait_until(lambda: len(socket.ids()) == 3)
    assert socket.ids() == new and all(i > last for i in new)


@pytest.mark.parametrize("world", [{"buffer": 2}], indirect=True)
async def test_a_room_live_here_answers_later_joins_without_the_broker(world: World) -> None:
    """Once a join asked the broker for the room's newest id while subscribed, later joins of
    the room here are answered from it and the messages heard since: no broker call (a
    reconnect storm asks once per room and worker), the same `last`, nothing missed after
    it; a join whose `since` is that id reads no history."""
    conn, socket = world.connect("ada")
    await world.hub.join(conn, "r", None)
    assert world.broker.last_ids == 1
    heard = await world.say("m0")
    await wait_until(lambda: socket.ids() == [heard])
    late, late_socket = world.connect("bob")
    await world.hub.join(late, "r", None)
    await wait_until(lambda: bool(late_socket.of_type("joined")))
    assert late_socket.of_type("joined")[0]["last"] == heard
    again, again_socket = world.connect("cy")
    await world.hub.join(again, "r", heard)
    await wait_until(lambda: bool(again_socket.of_type("joined")))
    assert again_socket.of_type("joined")[0]["recovered"] is True
    assert (world.broker.last_ids, world.broker.reads) == (1, 0)
    after = await world.say("m1")
    for sock in (socket, late_socket, again_socket):
        await wait_until(lambda sock=sock: sock.ids()[-1:] == [after])  # type: ignore[misc]
    assert late_socket.ids() == again_socket.ids() == [after]


async def test_joins_while_the_broker_is_asked_share_its_answer_without_a_gap(
    world: World,
) -> None:
    """Joins of a room that come while a join's `last_id` is on its way share it (one call
    for a room's members reconnecting together). A message the worker heard after the broker
    answered but before a join came is not that join's: its `last` is raised to it, so no
    message is missing after anyone's `last`."""
    first = await world.say("m0")
    world.broker.last_gate.clear()
    ada, ada_socket = world.connect("ada")
    joining_ada = asyncio.create_task(world.hub.join(ada, "r", None))
    await wait_until(lambda: world.broker.last_ids == 1)
    heard = await world.say("m1")  # after the answer was read, before bob joins
    bob, bob_socket = world.connect("bob")
    joining_bob = asyncio.create_task(world.hub.join(bob, "r", None))
    await asyncio.sleep(0)
    world.broker.last_gate.set()
    await asyncio.gather(joining_ada, joining_bob)
    assert world.broker.last_ids == 1
    await wait_until(lambda: bool(ada_socket.of_type("joined") and bob_socket.of_type("joined")))
    assert ada_socket.of_type("joined")[0]["last"] == first
    assert bob_socket.of_type("joined")[0]["last"] == heard
    after = await world.say("m2")
    await wait_until(lambda: ada_socket.ids()[-1:] == [after] and bob_socket.ids()[-1:] == [after])
    assert ada_socket.ids() == [heard, after] and bob_socket.ids() == [after]


async def test_a_join_after_the_subscription_was_lost_does_not_share_an_older_question(
    world: World,
) -> None:
    await world.say("m0")
    world.broker.last_gate.clear()
    ada, _ = world.connect("ada")
    joining_ada = asyncio.create_task(world.hub.join(ada, "r", None))
    await wait_until(lambda: world.broker.last_ids == 1)
    world.hub.link_lost()
    during = await world.say("during")
    world.hub.resubscribed()
    bob, bob_socket = world.connect("bob")
    joining_bob = asyncio.create_task(world.hub.join(bob, "r", None))
    await wait_until(lambda: world.broker.last_ids == 2)
    world.broker.last_gate.set()
    await asyncio.gather(joining_ada, joining_bob)
    await wait_until(lambda: bool(bob_socket.of_type("joined")))
    assert bob_socket.of_type("joined")[0]["last"] == during


@pytest.mark.parametrize("lost", ["link", "room"])
async def test_after_the_subscription_is_lost_a_join_asks_the_broker_again(
    world: World, lost: str
) -> None:
    """What the worker knew of a room's newest id is void once its subscription was lost
    (the whole link, or the room's shard on Redis Cluster): a message published meanwhile was
    not heard here, and a join answered from the old id would silently miss it."""
    conn, socket = world.connect("ada")
    await world.hub.join(conn, "r", None)
    before = await world.say("before")
    if lost == "link":
        world.hub.link_lost()
    else:
        world.hub.rooms_lost(["r"])
    during = await world.say("during")
    if lost == "link":
        world.hub.resubscribed()
    else:
        world.hub.rooms_back(["r"])
    late, late_socket = world.connect("bob")
    await world.hub.join(late, "r", None)
    assert world.broker.last_ids == 2
    await wait_until(lambda: bool(late_socket.of_type("joined")))
    assert late_socket.of_type("joined")[0]["last"] == during > before
    await wait_until(lambda: socket.ids() == [before, during])  # ada caught up from history
    await world.hub.join(world.connect("cy")[0], "r", None)
    assert world.broker.last_ids == 2  # known again


@pytest.mark.parametrize("world", [{"newest_known_for_s": 0.0}], indirect=True)
async def test_without_newest_known_for_s_every_join_asks_the_broker(world: World) -> None:
    for user in ("ada", "bob"):
        await world.hub.join(world.connect(user)[0], "r", None)
    await world.say("m0")
    await world.hub.join(world.connect("cy")[0], "r", None)
    assert world.broker.last_ids == 3


@pytest.mark.parametrize("world", [{"buffer": 2}], indirect=True)
async def test_live_messages_past_the_buffer_are_read_again_from_history(
    world: World,
) -> None:
    """A replay holds at most `buffer` live frames while it reads; past that it drops them
    and reads history again after its page: still no gap, no duplicate."""
    missed = [await world.say(f"m{n}") for n in range(3)]
    conn, socket = world.connect("ada")
    world.broker.gate.clear()
    joining = asyncio.create_task(world.hub.join(conn, "r", missed[0]))
    await wait_until(lambda: world.broker.reads == 1)
    live = [await world.say(f"l{n}") for n in range(5)]  # more than the buffer holds
    world.broker.gate.set()
    await joining
    await wait_until(lambda: len(socket.ids()) == 7)
    assert socket.ids() == missed[1:] + live
    assert world.broker.reads >= 2  # the overflow was read from history
    await wait_until(lambda: world.hub.behind("r") == 0)


async def test_members_catch_up_after_the_subscription_is_lost(world: World) -> None:
    """When the broker loses its subscription every member falls behind; what was published
    meanwhile (heard or not) comes from history once it is back: in order, once."""
    conn, socket = world.connect("ada")
    await world.hub.join(conn, "r", None)
    before = await world.say("before")
    await wait_until(lambda: socket.ids() == [before])
    world.hub.link_lost()
    assert world.hub.behind("r") == 1
    during = [await world.say(f"d{n}") for n in range(3)]
    assert socket.ids() == [before]  # nothing live while unlinked
    world.hub.resubscribed()
    await wait_until(lambda: len(socket.ids()) == 4)
    assert socket.ids() == [before, *during]
    await wait_until(lambda: world.hub.behind("r") == 0)


@pytest.mark.parametrize("world", [{"recovery_max_messages": 3}], indirect=True)
async def test_a_gap_too_long_to_replay_is_reported_not_hidden(world: World) -> None:
    """After an outage with more missed than recovery_max_messages, the member gets a
    `resync` error for the room, then live messages again."""
    conn, socket = world.connect("ada")
    await world.hub.join(conn, "r", None)
    world.hub.link_lost()
    for n in range(5):
        await world.say(f"d{n}")
    world.hub.resubscribed()
    await wait_until(lambda: bool(socket.of_type("error")))
    assert socket.of_type("error")[0]["code"] == "resync"
    assert socket.of_type("error")[0]["room"] == "r"
    await wait_until(lambda: world.hub.behind("r") == 0)
    after = await world.say("after")
    await wait_until(lambda: socket.ids()[-1:] == [after])


@pytest.mark.parametrize("world", [{"recovery_max_messages": 3}], indirect=True)
async def test_a_link_lost_during_a_join_answered_not_recovered_is_a_new_gap(
    world: World,
) -> None:
    """A join whose `since` cannot be recovered answers `recovered:false` (the gap before
    it); if the subscription is lost while it runs, a message published then is not silently
    skipped either: the client gets a `resync` for the room (found by the Sentinel chaos run,
    where a worker resubscribed twice in a row)."""
    since = await world.say("m0")
    for n in range(5):
        await world.say(f"m{n + 1}")
    conn, socket = world.connect("ada")
    world.broker.gate.clear()
    join = asyncio.create_task(world.hub.join(conn, "r", since))
    await wait_until(lambda: world.broker.reads == 1)
    world.hub.link_lost()
    during = await world.say("during")
    world.hub.resubscribed()
    world.broker.gate.set()
    await join
    assert socket.of_type("joined")[0]["recovered"] is False
    await wait_until(lambda: bool(socket.of_type("error")) or during in socket.ids())
    assert [e["code"] for e in socket.of_type("error")] == ["resync"]
    await wait_until(lambda: world.hub.behind("r") == 0)
    after = await world.say("after")
    await wait_until(lambda: socket.ids()[-1:] == [after])


async def test_a_rejoin_with_since_replays_again(world: World) -> None:
    """A client that lost track rejoins with an older `since`: it gets those messages again,
    then live ones, without leaving the room."""
    conn, socket = world.connect("ada")
    await world.hub.join(conn, "r", None)
    first = [await world.say(f"m{n}") for n in range(3)]
    await wait_until(lambda: socket.ids() == first)
    await world.hub.join(conn, "r", first[0])
    await wait_until(lambda: socket.ids() == first + first[1:])
    assert len(socket.of_type("joined")) == 2
    later = await world.say("later")
    await wait_until(lambda: socket.ids()[-1:] == [later])
    assert socket.ids().count(later) == 1


async def test_heartbeat_pings_are_spread_over_the_interval(world: World) -> None:
    """Each connection is pinged once per interval, by slices: no tick pings every socket at
    once (that burst, and the pongs it brings back, stalled the worker); one that has not had
    its `hello` yet is not pinged; a tick visits its slice's connections only, and a closed
    connection leaves its slice."""
    from app.sockets.heartbeat import _tick
    from app.sockets.slices import SLICES

    sockets = [world.connect(f"u{n}")[1] for n in range(3 * SLICES)]
    waiting, not_greeted = world.connect("still-authenticating")
    waiting.greeted = False  # its `hello` is not sent yet: nothing may come before it
    groups = [world.hub.slices.group(part) for part in range(SLICES)]
    assert sum(map(len, groups)) == len(world.hub.connections) == 3 * SLICES + 1
    assert max(map(len, groups)) - min(map(len, groups)) <= 1  # dealt in turn

    def pinged() -> int:
        return sum(len(socket.of_type("ping")) for socket in sockets)

    sizes = []
    for part in range(SLICES):
        before = pinged()
        _tick(world.hub, [part], {}, 15)
        for _ in range(3):  # the flusher writes in a later loop iteration
            await asyncio.sleep(0)
        sizes.append(pinged() - before)
    assert all(len(socket.of_type("ping")) == 1 for socket in sockets)
    assert not not_greeted.frames
    assert sizes == [len(group) - (waiting in group) for group in groups]

    await world.hub.remove(waiting)
    assert all(waiting not in world.hub.slices.group(part) for part in range(SLICES))


async def test_snapshot_counts_memberships_and_the_bytes_queued(world: World) -> None:
    """The gauges' figures, kept as connections come and go rather than counted by walking
    them: memberships follow joins (a join again counts once), leaves and removals; the bytes
    queued are every outbox's, and the most one holds; none once they are written."""
    ada, _ = world.connect("ada")
    bob, _ = world.connect("bob")
    for conn, room in ((ada, "r"), (ada, "s"), (bob, "r"), (ada, "r")):
        await world.hub.join(conn, room, None)
    snapshot = world.hub.snapshot()
    assert snapshot.memberships == 3 == sum(len(c.rooms) for c in world.hub.connections)
    for _ in range(5):  # the `joined` frames are written
        await asyncio.sleep(0)
    assert (world.hub.snapshot().queued_bytes, world.hub.snapshot().max_queued_bytes) == (0, 0)
    big, small = '{"type":"x","pad":"' + "a" * 80 + '"}', '{"type":"y"}'
    ada.offer(big)
    bob.offer(small)
    snapshot = world.hub.snapshot()
    assert (snapshot.queued_bytes, snapshot.max_queued_bytes) == (len(big) + len(small), len(big))
    await world.hub.leave(ada, "s")
    await world.hub.leave(ada, "s")  # not in it: nothing to count
    assert world.hub.snapshot().memberships == 2
    await world.hub.remove(bob)
    assert world.hub.snapshot().memberships == 1 == len(ada.rooms)


async def test_snapshot_counts_the_memberships_behind_and_forgets_rooms_caught_up(
    world: World,
) -> None:
    """`memberships_behind`: a join replaying counts until it is live; after a lost
    subscription every member counts, in every room, until each has caught up; and rooms
    where none is behind any more are not walked again (the gauges read it every second)."""
    missed = [await world.say(f"m{n}") for n in range(3)]
    ada, _ = world.connect("ada")
    bob, _ = world.connect("bob")
    await world.hub.join(bob, "s", None)
    await world.say("live", "s")
    await wait_until(lambda: world.hub.behind("s") == 0)
    world.broker.gate.clear()
    joining = asyncio.create_task(world.hub.join(ada, "r", missed[0]))
    await wait_until(lambda: world.broker.reads == 1)
    assert world.hub.snapshot().memberships_behind == 1
    world.broker.gate.set()
    await joining
    assert world.hub.snapshot().memberships_behind == 0  # replayed: it waits to hear one live
    await world.say("live")
    await wait_until(lambda: world.hub.behind("r") == 0)
    assert world.hub.snapshot().memberships_behind == 0 and not world.hub._rooms_catching_up

    world.broker.gate.clear()
    world.hub.link_lost()
    assert world.hub.snapshot().memberships_behind == 2  # ada in r, bob in s
    world.hub.resubscribed()
    await wait_until(lambda: world.broker.reads >= 2)
    assert world.hub.snapshot().memberships_behind == 2  # their history reads wait
    world.broker.gate.set()
    await wait_until(lambda: world.hub.snapshot().memberships_behind == 0)
    assert world.hub.behind("r") == world.hub.behind("s") == 0
    assert not world.hub._rooms_catching_up
    await world.hub.leave(ada, "r")
    assert world.hub.snapshot().memberships_behind == 0
    # A room left while someone is behind in it takes its name out with it, read or not.
    world.broker.gate.clear()
    joining = asyncio.create_task(world.hub.join(ada, "t", missed[0]))
    await wait_until(lambda: "t" in world.hub._rooms_catching_up)
    await world.hub.leave(ada, "t")
    assert "t" not in world.hub._rooms_catching_up
    world.broker.gate.set()
    with contextlib.suppress(Exception):
        await joining


async def test_token_expiry_looks_at_every_connection_a_chunk_at_a_time(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pass asks every connection whose token is due for a refresh once and closes
    (4002) every one whose token has expired, over more connections than one chunk, letting
    the loop run between chunks; connections without a token are left alone."""
    from app.access import token_expiry
    from app.access.auth import Identity

    monkeypatch.setattr(token_expiry, "CHECK_INTERVAL_S", 0.01)
    monkeypatch.setattr(token_expiry, "CHUNK", 100)
    now = time.time()
    due: list[RecordingSocket] = []
    expired: list[RecordingSocket] = []
    plain: list[RecordingSocket] = []
    for n in range(250):
        conn, socket = world.connect(f"u{n}")
        if n % 3 == 0:
            plain.append(socket)
            continue
        expires_at = now + 30 if n % 3 == 1 else now - 1
        conn.identity = Identity(conn.user, expires_at=expires_at)
        (due if n % 3 == 1 else expired).append(socket)
    passes: list[int] = []
    original = token_expiry.check_tokens

    def check_tokens(conns: list[Connection], refresh_before_s: float, now: float) -> None:
        passes.append(len(conns))
        original(conns, refresh_before_s, now)

    monkeypatch.setattr(token_expiry, "check_tokens", check_tokens)
    task = asyncio.create_task(token_expiry.run_token_expiry(world.hub, 60.0))
    try:
        await wait_until(lambda: all(socket.closed for socket in expired))
        await wait_until(lambda: all(socket.of_type("refresh") for socket in due))
        await wait_until(lambda: len(passes) >= 6)
    finally:
        task.cancel()
    assert max(passes) == 100 and 50 in passes  # 250 a pass: 100, 100, 50
    assert {socket.closed for socket in expired} == {4002}
    assert all(len(socket.of_type("refresh")) == 1 and not socket.closed for socket in due)
    assert not any(socket.frames or socket.closed for socket in plain)


async def test_heartbeat_under_a_short_interval_takes_several_slices_a_tick(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interval too short for a tick a slice (0.2 s over 1,024 slices: 0.2 ms apart) gets
    ticks of MIN_TICK_S, each taking the next slices: every connection is pinged within an
    interval, and one that stays silent is closed (4009) once its timeout has passed."""
    from app.sockets import heartbeat

    sockets = [world.connect(f"u{n}")[1] for n in range(300)]
    taken: list[int] = []
    tick = heartbeat._tick

    def counting(hub: Hub, parts: list[int], checks: dict[int, float], nbytes: int) -> None:
        taken.append(len(parts))
        tick(hub, parts, checks, nbytes)

    monkeypatch.setattr(heartbeat, "_tick", counting)
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(heartbeat.run_heartbeat(world.hub, 0.2, 0.1))
    try:
        await wait_until(lambda: all(socket.of_type("ping") for socket in sockets), timeout=5)
        pinged = loop.time() - started
        await wait_until(lambda: all(socket.closed for socket in sockets), timeout=5)
    finally:
        task.cancel()
    assert pinged < 1.0, pinged  # within an interval, but for a slow machine's lag
    assert set(taken) == {52}  # ceil(1,024 x 0.01 / 0.2) slices a tick
    assert {socket.closed for socket in sockets} == {4009}


async def test_heartbeat_closes_the_silent_of_the_slice_it_checks(world: World) -> None:
    """A tick closes (4009) the greeted connections of a checked slice that sent nothing
    since its ping; one heard from since, or in another slice, or not greeted, stays."""
    from app.sockets.heartbeat import _tick
    from app.sockets.slices import SLICES

    conns = [world.connect(f"u{n}")[0] for n in range(2 * SLICES)]
    silent = conns[0]
    part = next(p for p in range(SLICES) if silent in world.hub.slices.group(p))
    same = [conn for conn in world.hub.slices.group(part) if conn is not silent]
    assert same  # two connections a slice
    other = next(conn for conn in conns if conn not in world.hub.slices.group(part))
    pinged_at = max(conn.last_seen for conn in conns) + 1.0
    for conn in same:
        conn.last_seen = pinged_at + 0.5  # a pong came after the ping
    _tick(world.hub, [(part + 1) % SLICES], {part: pinged_at}, 15)
    assert silent.closing
    assert not any(conn.closing for conn in same)
    assert not other.closing


async def test_hidden_senders_are_filtered_live_in_replays_and_direct_messages(
    world: World,
) -> None:
    """Whom a connection's user hides (app.access.hiding) is filtered on every delivery path
    of the Hub: live members (hidden before the join, or changed while in the room), a
    replay from history, direct messages; everyone else gets everything; unhiding shows the
    next ones."""
    old = await world.say("old")
    ada, ada_socket = world.connect("ada")
    ada.hidden = frozenset({"talker"})  # as the session sets it before any join
    bob, bob_socket = world.connect("bob")
    await world.hub.register_user(ada)
    await world.hub.register_user(bob)
    await world.hub.join(ada, "r", old - 1)  # a replay: "old" is the talker's
    await world.hub.join(bob, "r", None)
    said = [await world.say("hidden"), (await world.broker.publish("r", "eve", "shown", None)).id]
    await wait_until(lambda: len(bob_socket.ids()) == 2)
    await wait_until(lambda: len(ada_socket.ids()) == 1)
    assert ada_socket.ids() == [said[1]] and bob_socket.ids() == said
    late, late_socket = world.connect("ada")  # joins live, hiding from the start
    late.hidden = frozenset({"talker"})
    await world.hub.join(late, "r", None)
    live = [await world.say("live"), (await world.broker.publish("r", "eve", "y", None)).id]
    await wait_until(lambda: len(bob_socket.ids()) == 4)
    await wait_until(lambda: len(late_socket.ids()) == 1)
    assert late_socket.ids() == [live[1]] and world.hub.behind("r") == 0
    assert ada_socket.ids() == [said[1], live[1]]
    await world.hub.leave(late, "r")
    await world.broker.publish_direct("talker", "ada", "psst", None)
    await world.broker.publish_direct("eve", "ada", "hi", None)
    await wait_until(lambda: len(ada_socket.of_type("message")) == 3)
    assert [f["text"] for f in ada_socket.of_type("message")] == ["shown", "y", "hi"]
    world.hub.set_hidden("bob", frozenset({"eve"}), None)  # changed while in the room
    world.hub.set_hidden("ada", frozenset(), '{"type":"hidden","muted":[],"blocked":[]}')
    again = [await world.say("again"), (await world.broker.publish("r", "eve", "x", None)).id]
    await wait_until(lambda: ada_socket.ids()[-2:] == again)
    await wait_until(lambda: bob_socket.ids()[-1:] == [again[0]])
    assert bob_socket.ids() == [*said, *live, again[0]]
    assert ada_socket.of_type("hidden") == [{"type": "hidden", "muted": [], "blocked": []}]
