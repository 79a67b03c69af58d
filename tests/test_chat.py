"""Chatting through a real uvicorn server: rooms, order, acks and duplicate suppression."""

from __future__ import annotations

import asyncio
import contextlib

from tests.helpers import ChatClient, LiveServer


async def test_two_clients_chat(server: LiveServer) -> None:
    """Both members of a room get a message, the sender included, with id, user, text, ts."""
    async with (
        ChatClient.connect(server.ws_url("alice")) as alice,
        ChatClient.connect(server.ws_url("bob")) as bob,
    ):
        assert alice.hello["user"] == "alice"
        joined = await alice.join("lobby")
        # A new room's `last` is where its log begins: no message has a smaller id.
        origin = joined.pop("last")
        assert joined == {"type": "joined", "room": "lobby", "count": 1, "users": ["alice"]}
        await bob.join("lobby")
        await alice.say("lobby", "hi bob")
        for client in (alice, bob):
            msg = await client.expect("message")
            assert msg["room"] == "lobby" and msg["id"] > origin
            assert msg["user"] == "alice"
            assert msg["text"] == "hi bob"
            assert isinstance(msg["id"], int)
            assert isinstance(msg["ts"], int)
        await bob.say("lobby", "hi alice")
        assert (await alice.expect("message"))["text"] == "hi alice"


async def test_guest_name_when_none_given(server: LiveServer) -> None:
    """Without ?name= the server makes up a guest name."""
    async with ChatClient.connect(server.ws_url()) as guest:
        assert guest.hello["user"].startswith("guest-")


async def test_rooms_are_isolated(server: LiveServer) -> None:
    """A message reaches its room's members only."""
    async with (
        ChatClient.connect(server.ws_url("a")) as a,
        ChatClient.connect(server.ws_url("b")) as b,
    ):
        await a.join("red")
        await b.join("blue")
        await a.say("red", "for red")
        await b.say("blue", "for blue")
        assert (await a.expect("message"))["text"] == "for red"
        assert (await b.expect("message"))["text"] == "for blue"
        # Each socket is otherwise quiet: the next thing it gets is the answer to its own ping.
        assert await a.is_responsive()
        assert await b.is_responsive()


async def test_many_clients_same_order(server: LiveServer) -> None:
    """With several concurrent publishers every member sees the same messages in the same
    order, and ids increase in that order."""
    members, publishers, per_publisher = 20, 4, 25
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(ChatClient.connect(server.ws_url(f"u{i}")))
            for i in range(members)
        ]
        for client in clients:
            await client.join("busy")

        async def publish(client: ChatClient, n: int) -> None:
            for k in range(per_publisher):
                await client.say("busy", f"{n}:{k}")

        await asyncio.gather(*(publish(clients[n], n) for n in range(publishers)))
        total = publishers * per_publisher
        seen = [await client.messages(total) for client in clients]
        orders = [[m["id"] for m in msgs] for msgs in seen]
        assert all(order == orders[0] for order in orders)
        assert orders[0] == sorted(orders[0]) and len(set(orders[0])) == total
        # Each publisher's own messages keep their send order.
        texts = [m["text"] for m in seen[0]]
        for n in range(publishers):
            mine = [t for t in texts if t.startswith(f"{n}:")]
            assert mine == [f"{n}:{k}" for k in range(per_publisher)]


async def test_ack_and_duplicate_cid(server: LiveServer) -> None:
    """A send with a cid is acked with the message id; retrying the same cid is acked with the
    same id, flagged duplicate, and not delivered again."""
    async with (
        ChatClient.connect(server.ws_url("alice")) as alice,
        ChatClient.connect(server.ws_url("bob")) as bob,
    ):
        await alice.join("r")
        await bob.join("r")
        await alice.say("r", "once", cid="c-1")
        message = await alice.expect("message")
        ack = await alice.expect("ack")
        assert ack == {"type": "ack", "cid": "c-1", "id": message["id"]}
        await alice.say("r", "once", cid="c-1")
        retry = await alice.expect("ack")
        assert retry == {"type": "ack", "cid": "c-1", "id": message["id"], "duplicate": True}
        await alice.say("r", "twice", cid=7)
        assert (await alice.expect("message"))["text"] == "twice"
        assert (await alice.expect("ack"))["cid"] == 7
        # bob got each message once: "once", then "twice", nothing in between.
        assert [m["text"] for m in await bob.messages(2)] == ["once", "twice"]


async def test_leave_stops_delivery(server: LiveServer) -> None:
    """After leave, a client gets `left` and no more messages of that room."""
    async with (
        ChatClient.connect(server.ws_url("a")) as a,
        ChatClient.connect(server.ws_url("b")) as b,
    ):
        await a.join("r")
        await b.join("r")
        await b.send({"type": "leave", "room": "r"})
        assert await b.expect("left") == {"type": "left", "room": "r"}
        await a.say("r", "after leave")
        await a.expect("message")
        assert await b.is_responsive()  # no message arrived before the pong


async def test_join_is_idempotent(server: LiveServer) -> None:
    """Joining a room twice answers `joined` again and delivers messages once."""
    async with ChatClient.connect(server.ws_url("a")) as a:
        await a.join("r")
        await a.join("r")
        await a.say("r", "x")
        await a.expect("message")
        assert await a.is_responsive()


async def test_ping_pong(server: LiveServer) -> None:
    """A client ping is answered with a pong."""
    async with ChatClient.connect(server.ws_url("a")) as a:
        await a.send({"type": "ping"})
        assert await a.expect("pong") == {"type": "pong"}


async def test_coalesced_frames_keep_order(server: LiveServer) -> None:
    """A burst may arrive as fewer frames of newline-separated objects, in order, none lost."""
    async with ChatClient.connect(server.ws_url("a")) as a:
        await a.join("r")
        for k in range(200):
            await a.say("r", str(k))
        assert [m["text"] for m in await a.messages(200)] == [str(k) for k in range(200)]
