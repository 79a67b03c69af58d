"""The Python client SDK (clients/python, ``hubbub_client``) against real servers: in-process
uvicorn servers, and separate server processes on one Redis that are killed, restarted,
stopped (SIGSTOP) and resumed. Nothing is mocked: every frame crosses a real socket."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx2 as httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hubbub_client import (
    DM,
    ERROR_CODES,
    TERMINAL_CLOSE_CODES,
    Ack,
    AckTimeoutError,
    Attachment,
    ClientClosedError,
    Deleted,
    DirectMessage,
    Edited,
    Event,
    Hello,
    HiddenUsers,
    HubbubClient,
    HubbubError,
    InboxEntry,
    Invited,
    Joined,
    Mentioned,
    Message,
    NotificationSetting,
    Presence,
    Reaction,
    Receipt,
    Resync,
    ServerError,
    StateChange,
    Typing,
    apply_event,
    backoff_delay,
)
from PIL import Image

from app.errors import CloseCode, ErrorCode
from app.notify.webpush import generate_keys
from app.sockets.connection import Connection
from tests.helpers import (
    ChatClient,
    LiveServer,
    make_settings,
    run_server,
    send_until_acked,
    wait_until,
)
from tests.processes import ROOT, AppProcess, RedisServer

E = TypeVar("E", bound=Event)
T = TypeVar("T")
SECRET = "a-test-secret-that-is-long-enough-for-hs256"
ECHO_BOT = ROOT / "clients" / "python" / "examples" / "echo_bot.py"


def sdk(url: str, name: str | None = None, **options: Any) -> HubbubClient:
    """A client that retries fast (tests wait for reconnects)."""
    defaults: dict[str, Any] = {"base_delay_s": 0.05, "max_delay_s": 0.5, "open_timeout_s": 3.0}
    return HubbubClient(url, name=name, **(defaults | options))


def ws_url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/ws"


class Seen:
    """Every event a client emits, in order, recorded by a callback (the dispatcher task)."""

    def __init__(self, client: HubbubClient) -> None:
        self.events: list[Event] = []
        client.on(Event, self.events.append)

    def of(self, kind: type[E]) -> list[E]:
        return [event for event in self.events if isinstance(event, kind)]

    def texts(self, room: str) -> list[str]:
        return [m.text for m in self.of(Message) if m.room == room]

    def presence(self, user: str, event: str) -> bool:
        """Whether a presence announcement of ``user``'s ``event`` came."""
        return any(p.user == user and p.event == event for p in self.of(Presence))

    def states(self) -> list[tuple[str, int | None]]:
        return [(change.state, change.code) for change in self.of(StateChange)]


def connection_of(live: LiveServer, user: str) -> Connection:
    return next(conn for conn in live.state.hub.connections if conn.user == user)


def close_connections_of(live: LiveServer, user: str, code: CloseCode) -> None:
    """The server closes ``user``'s sockets with ``code`` (1012: as a drain does)."""
    for conn in list(live.state.hub.connections):
        if conn.user == user:
            conn.close(code, "draining: reconnect")


@contextlib.asynccontextmanager
async def processes(*apps: AppProcess) -> AsyncIterator[None]:
    try:
        for app in apps:
            await app.start()
        yield
    finally:
        for app in apps:
            if app.proc is not None and app.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    app.signal(signal.SIGCONT)
            await app.stop()


@pytest.mark.timeout(10)
def test_the_sdk_knows_the_servers_close_and_error_codes() -> None:
    """The codes after which the client stays closed are those the server marks terminal
    (app/errors.py); the error codes it names are the server's."""
    assert {code for code in CloseCode if not code.should_reconnect} == TERMINAL_CLOSE_CODES
    assert set(ERROR_CODES) == {code.value for code in ErrorCode}


@pytest.mark.timeout(10)
def test_backoff_is_full_jitter_under_a_growing_cap() -> None:
    """Each delay is random in [0.1 s, min(max, base * 2**attempt)]: spread, not fixed."""
    for attempt in range(12):
        cap = min(15.0, 0.5 * 2**attempt)
        delays = [backoff_delay(attempt, 0.5, 15.0) for _ in range(200)]
        assert all(0.1 <= d <= max(cap, 0.1) for d in delays)
        assert max(delays) - min(delays) > cap / 4  # jittered over the whole range
    assert backoff_delay(10_000, 0.5, 15.0) <= 15.0


@pytest.mark.timeout(60)
async def test_connect_join_send_and_receive() -> None:
    """connecting → open with the server's hello; a join answered by ``joined``; a send
    resolved with its ack; the message reaches the other client (and the sender) once."""
    async with run_server(make_settings()) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        seen_ada, seen_bob = Seen(ada), Seen(bob)
        assert ada.state == "idle"
        async with ada, bob:
            assert isinstance(ada.hello, Hello) and ada.user == "ada" and bob.user == "bob"
            assert ada.hello.limits["heartbeat_interval_s"] == 25.0
            joined = await ada.join("lobby")
            assert isinstance(joined, Joined) and joined.room == "lobby" and joined.last is not None
            await bob.join("lobby")
            ack = await ada.send("lobby", "hello bob")
            assert isinstance(ack, Ack) and not ack.duplicate and ack.id > joined.last
            await wait_until(lambda: seen_bob.texts("lobby") == ["hello bob"])
            await wait_until(lambda: seen_ada.texts("lobby") == ["hello bob"])
            message = seen_bob.of(Message)[0]
            assert (message.id, message.user, message.room) == (ack.id, "ada", "lobby")
            assert ada.last_id["lobby"] == ack.id
            # A reply names the message it answers.
            reply = await bob.send("lobby", "hi ada", reply_to=ack.id)
            await wait_until(lambda: len(seen_ada.of(Message)) == 2)
            assert seen_ada.of(Message)[1].reply_to == ack.id
            assert seen_ada.of(Message)[1].id == reply.id
        assert seen_ada.states() == [("connecting", None), ("open", None), ("closed", 1000)]


@pytest.mark.timeout(60)
async def test_a_refused_send_raises_its_code_and_a_retry_keeps_the_cid() -> None:
    """A text too long: the send's future raises HubbubError("text_too_long") carrying the
    send's cid; the composer retries with that cid (acked once, then as a duplicate of the
    same id, and delivered once). A send to a room not joined: ``not_joined``."""
    async with run_server(make_settings(max_text_chars=10)) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        seen_bob = Seen(bob)
        async with ada, bob:
            await ada.join("r")
            await bob.join("r")
            refused = ada.send("r", "x" * 11)
            with pytest.raises(HubbubError) as caught:
                await refused
            assert caught.value.code == "text_too_long"
            assert caught.value.cid == refused.cid
            first = await ada.send("r", "fixed", cid=refused.cid)
            again = await ada.send("r", "fixed", cid=refused.cid)
            assert (first.cid, first.duplicate) == (refused.cid, False)
            assert (again.id, again.duplicate) == (first.id, True)
            with pytest.raises(HubbubError) as outside:
                await ada.send("elsewhere", "hi")
            assert outside.value.code == "not_joined"
            last = await ada.send("r", "last")
            await wait_until(lambda: seen_bob.texts("r")[-1:] == ["last"])
            assert seen_bob.texts("r") == ["fixed", "last"]
            assert [m.id for m in seen_bob.of(Message)] == [first.id, last.id]


@pytest.mark.timeout(60)
async def test_a_replay_of_what_was_delivered_is_not_delivered_again() -> None:
    """A join with ``since`` of a room the connection is in replays from ``since`` again
    (what a join racing live messages gets): the client hands on no id twice. The join frame
    is written by hand, with the position of the first join."""
    async with run_server(make_settings()) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        seen = Seen(ada)
        async with ada, bob:
            first = await ada.join("x")
            await bob.join("x")
            for text in ("a", "b", "c"):
                await bob.send("x", text)
            await wait_until(lambda: seen.texts("x") == ["a", "b", "c"])
            assert first.last is not None
            assert ada._write({"type": "join", "room": "x", "since": first.last})
            await wait_until(lambda: len(seen.of(Joined)) == 2)
            assert seen.of(Joined)[1].recovered is True
            await bob.send("x", "d")
            await wait_until(lambda: seen.texts("x")[-1:] == ["d"])
            assert seen.texts("x") == ["a", "b", "c", "d"]


@pytest.mark.timeout(60)
async def test_history_pages_and_a_refused_history() -> None:
    async with run_server(make_settings()) as live:
        async with sdk(live.ws_url(), "ada") as ada:
            await ada.join("h")
            acks = [await ada.send("h", f"m{k}") for k in range(7)]
            page = await ada.history("h", limit=3)
            assert [m.text for m in page] == ["m4", "m5", "m6"]
            assert [m.id for m in page] == [a.id for a in acks[4:]]
            older = await ada.history("h", before=page[0].id, limit=10)
            assert [m.text for m in older] == ["m0", "m1", "m2", "m3"]
            # Several requests in flight are paired with their answers in order.
            pages = await asyncio.gather(
                ada.history("h", limit=1), ada.history("h", limit=2), ada.history("h", limit=3)
            )
            assert [[m.text for m in p] for p in pages] == [["m6"], ["m5", "m6"], page_texts(page)]
            with pytest.raises(HubbubError) as caught:
                await ada.history("nobody-uses-this-room")
            assert caught.value.code == "not_found"


def page_texts(page: list[Message]) -> list[str]:
    return [m.text for m in page]


@pytest.mark.timeout(60)
async def test_direct_messages_live_and_in_history() -> None:
    async with run_server(make_settings()) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        seen_ada, seen_bob = Seen(ada), Seen(bob)
        async with ada, bob:
            ack = await ada.send_to("bob", "psst")
            await wait_until(lambda: len(seen_bob.of(DirectMessage)) == 1)
            got = seen_bob.of(DirectMessage)[0]
            assert (got.id, got.user, got.to, got.peer, got.text) == (
                ack.id, "ada", "bob", "ada", "psst"
            )  # fmt: skip
            assert got.conversation == DM("ada")
            # The sender's own copy: the peer is the other user.
            await wait_until(lambda: len(seen_ada.of(DirectMessage)) == 1)
            assert seen_ada.of(DirectMessage)[0].peer == "bob"
            answer = await bob.send_to("ada", "yes?", reply_to=ack.id)
            page = await ada.direct_history("bob")
            assert [(m.text, m.id) for m in page.messages] == [
                ("psst", ack.id),
                ("yes?", answer.id),
            ]
            assert page.messages[1].reply_to == ack.id and page.more is False
            assert ada.last_direct["bob"] == answer.id
            assert bob.last_direct["ada"] == answer.id


@pytest.mark.timeout(60)
async def test_edits_reactions_and_deletions_arrive_as_events() -> None:
    async with run_server(make_settings()) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        seen_bob = Seen(bob)
        async with ada, bob:
            await ada.join("ev")
            await bob.join("ev")
            sent = await ada.send("ev", "helo")
            edit = await ada.edit("ev", sent.id, "hello")
            reaction = await bob.react("ev", sent.id, "👍")
            with pytest.raises(HubbubError) as caught:
                await bob.edit("ev", sent.id, "mine now")
            assert caught.value.code == "forbidden"
            await wait_until(lambda: len(seen_bob.of(Reaction)) == 1)
            edited, reacted = seen_bob.of(Edited)[0], seen_bob.of(Reaction)[0]
            assert (edited.id, edited.target, edited.text, edited.user) == (
                edit.id, sent.id, "hello", "ada"
            )  # fmt: skip
            assert (reacted.id, reacted.emoji, reacted.on, reacted.user) == (
                reaction.id, "👍", True, "bob"
            )  # fmt: skip
            message = apply_event(apply_event(seen_bob.of(Message)[0], edited), reacted)
            assert (message.text, dict(message.reactions)) == ("hello", {"👍": ("bob",)})
            # The history page shows the message as its events left it.
            (stored,) = await bob.history("ev")
            assert (stored.text, stored.edited, dict(stored.reactions)) == (
                "hello", edited.ts, {"👍": ("bob",)}
            )  # fmt: skip
            # Events and messages share one sequence: the position is the newest event.
            assert bob.last_id["ev"] == reaction.id
            await ada.delete("ev", sent.id)
            await wait_until(lambda: [e.kind for e in seen_bob.events][-1:] == ["deleted"])


@pytest.mark.timeout(60)
async def test_typing_and_presence() -> None:
    async with run_server(make_settings()) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        seen_ada = Seen(ada)
        async with ada:
            await ada.join("p")
            async with bob:
                joined = await bob.join("p")
                assert joined.count == 2 and set(joined.users or ()) == {"ada", "bob"}
                await wait_until(
                    lambda: any(
                        p.user == "bob" and p.event == "join" for p in seen_ada.of(Presence)
                    )
                )
                assert bob.typing("p") is True
                await wait_until(lambda: [(t.room, t.user) for t in seen_ada.of(Typing)] == [
                    ("p", "bob")
                ])  # fmt: skip
            await wait_until(lambda: seen_ada.presence("bob", "leave"))
            assert seen_ada.of(Presence)[-1].count == 1


@pytest.mark.timeout(60)
async def test_rooms_with_members_and_the_inbox(tmp_path: Path) -> None:
    """With a store: a private room created, bob invited (and told), listed among his rooms,
    joined; a second create is refused (``exists``); the directory finds the public room only;
    the inbox counts a direct message."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/chat.db")
    async with run_server(settings) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        seen_ada, seen_bob = Seen(ada), Seen(bob)
        async with ada, bob:
            room = await ada.create_room("team", private=True, title="The team")
            assert (room.room, room.private, room.title, room.role) == (
                "team", True, "The team", "owner"
            )  # fmt: skip
            with pytest.raises(HubbubError) as caught:
                await ada.create_room("team")
            assert caught.value.code == "exists"
            with pytest.raises(HubbubError) as outsider:
                await bob.join("team")
            assert outsider.value.code == "not_found"
            assert "team" not in bob.rooms  # refused for good: not rejoined
            invited = await ada.invite("team", "bob")
            assert dict(invited.members or {}) == {"ada": "owner", "bob": "member"}
            await wait_until(lambda: [i.room for i in seen_bob.of(Invited)] == ["team"])
            assert [r.room for r in await bob.list_rooms()] == ["team"]
            await ada.create_room("town", title="Town square")
            assert [r.room for r in await bob.find_rooms()] == ["town"]  # never "team"
            assert [r.title for r in await bob.find_rooms("SQUARE")] == ["Town square"]
            assert await bob.find_rooms("team") == []
            await bob.join("team")
            described = await ada.describe("team", topic="plans")
            assert (described.title, described.topic) == ("The team", "plans")
            sent = await ada.send_to("bob", "unread")
            async with asyncio.timeout(10):  # the inbox follows the archive, a bit behind
                while True:
                    inbox = await bob.inbox()
                    entry = next((e for e in inbox.conversations if e.peer == "ada"), None)
                    if entry is not None and entry.last is not None:
                        break
                    await asyncio.sleep(0.05)
            assert entry.last is not None
            assert entry.unread == 1 and entry.last.id == sent.id
            async with asyncio.timeout(10):  # indexed a moment after it is stored
                while not (found := await bob.search("UNREAD", peer="ada"))["results"]:
                    await asyncio.sleep(1)  # within the search rate (1/s)
            assert [(r["with"], r["id"], r["highlights"]) for r in found["results"]] == [
                ("ada", sent.id, [[0, 6]])
            ]  # fmt: skip
            assert (await bob.search("unread", room="team"))["results"] == []
            assert bob.read(DM("ada"), sent.id) is True
            await wait_until(lambda: [(r.user, r.id) for r in seen_ada.of(Receipt)] == [
                ("bob", sent.id)
            ])  # fmt: skip


@pytest.mark.timeout(60)
async def test_files_are_uploaded_sent_received_and_read_through_their_links(
    tmp_path: Path,
) -> None:
    """With a store (and local file storage, the default): ada uploads a PNG and a PDF and
    sends them with an empty text; bob receives the message with both as attachments (the
    image with its size), asks for their links (absolute, on the server) and downloads the
    very bytes, and the image's thumbnail. A direct message carries a file too, whose link
    an outsider is refused (``not_found``); a file over the limit is refused before any byte
    moves (``file_too_large``); a deleted message shows no attachments."""
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/data/chat.db", file_max_bytes=64 * 1024
    )
    image = io.BytesIO()
    Image.new("RGB", (640, 480), (30, 120, 200)).save(image, "PNG")
    png = image.getvalue()
    pdf = b"%PDF-1.4\n% the minutes\n" + bytes(range(256)) * 4
    async with run_server(settings) as live:
        ada, bob, eve = (sdk(live.ws_url(), name) for name in ("ada", "bob", "eve"))
        seen_bob = Seen(bob)
        async with ada, bob, eve, httpx.AsyncClient(timeout=10) as http:
            await ada.join("lobby")
            await bob.join("lobby")
            photo = await ada.upload("lobby", png, "photo.png")
            minutes = await ada.upload("lobby", pdf, "minutes.pdf")
            ack = await ada.send("lobby", "", attachments=[photo, minutes])
            await wait_until(lambda: [m.id for m in seen_bob.of(Message)] == [ack.id])
            message = seen_bob.of(Message)[0]
            assert message.text == "" and message.raw["attachments"]
            assert message.attachments == (
                Attachment(id=photo, name="photo.png", size=len(png), type="image/png",
                           image=True, width=640, height=480),
                Attachment(id=minutes, name="minutes.pdf", size=len(pdf),
                           type="application/pdf", image=False),
            )  # fmt: skip

            links = await bob.file_links(photo)
            assert (links["id"], links["name"], links["content_type"]) == (
                photo, "photo.png", "image/png"
            )  # fmt: skip
            assert links["url"].startswith(live.http_url + "/")  # absolute, on the server
            assert links["expires"] > time.time()
            got = await http.get(links["url"])
            assert got.status_code == 200 and got.content == png
            assert links["thumbnail"] is not None
            thumbnail = await http.get(links["thumbnail"])
            assert thumbnail.status_code == 200
            assert thumbnail.headers["content-type"] == "image/webp"
            assert Image.open(io.BytesIO(thumbnail.content)).width <= 640
            document = await bob.file_links(minutes)
            assert document["thumbnail"] is None
            got = await http.get(document["url"])
            assert got.status_code == 200 and got.content == pdf
            assert got.headers["content-disposition"].startswith("attachment;")

            # A direct message's file: its two people read it, nobody else (the same answer
            # as for a file that does not exist); two asked at once each get their answer.
            note = await ada.upload(DM("bob"), b"just for you", "note.txt")
            direct = await ada.send_to("bob", "see the note", attachments=[note])
            await wait_until(lambda: any(m.id == direct.id for m in seen_bob.of(DirectMessage)))
            received = next(m for m in seen_bob.of(DirectMessage) if m.id == direct.id)
            assert [a.name for a in received.attachments] == ["note.txt"]
            refused, missing, allowed = await asyncio.gather(
                eve.file_links(note), eve.file_links("A" * 22), bob.file_links(note),
                return_exceptions=True,
            )  # fmt: skip
            assert isinstance(refused, HubbubError) and refused.code == "not_found"
            assert isinstance(missing, HubbubError) and missing.code == "not_found"
            assert isinstance(allowed, dict) and allowed["name"] == "note.txt"

            with pytest.raises(HubbubError) as too_large:
                await ada.upload("lobby", bytes(64 * 1024 + 1), "big.bin")
            assert too_large.value.code == "file_too_large"

            await ada.delete("lobby", ack.id)
            await wait_until(lambda: len(seen_bob.of(Deleted)) == 1)
            assert apply_event(message, seen_bob.of(Deleted)[0]).attachments == ()
            async with asyncio.timeout(5):  # its files go right after the deletion's ack
                while True:
                    try:
                        await bob.file_links(photo)
                    except HubbubError as gone:
                        assert gone.code == "not_found"
                        break
                    await asyncio.sleep(0.05)


async def until_true(check: Callable[[], Awaitable[T | None]], timeout: float = 10.0) -> T:
    """Call ``check`` until it returns something (not None or False), every 0.05 s."""
    async with asyncio.timeout(timeout):
        while not (value := await check()):
            await asyncio.sleep(0.05)
    return value


@pytest.mark.timeout(60)
async def test_mentions_arrive_are_listed_and_counted_until_read(tmp_path: Path) -> None:
    """With a store: a message naming bob carries ``mentions`` (not a user who takes no part
    in the room), and bob's client emits ``Mentioned`` after the message (ada's none for her
    own); ``mentions()`` lists his mentions newest first, unread, pages back with ``before``,
    and the inbox counts them; once read (``read``), they are not unread any more. ``@here``
    is ``here`` and a ``Mentioned`` too."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/chat.db")
    async with run_server(settings) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        seen_ada, seen_bob = Seen(ada), Seen(bob)
        async with ada, bob:
            await ada.create_room("team")
            await ada.invite("team", "bob")
            await ada.join("team")
            await bob.join("team")
            plain = await ada.send("team", "no one in particular")
            await wait_until(lambda: seen_bob.texts("team") == ["no one in particular"])
            assert seen_bob.of(Message)[0].mentions == () and not seen_bob.of(Mentioned)
            assert bob.read("team", plain.id)  # bob has the room in his inbox

            first = await ada.send("team", "hey @bob, and @carol: look")
            await wait_until(lambda: len(seen_bob.of(Mentioned)) == 1)
            message = seen_bob.of(Message)[-1]
            assert (message.id, message.mentions, message.here) == (first.id, ("bob",), False)
            assert message.raw["mentions"] == ["bob"]  # carol takes no part: not mentioned
            mentioned = seen_bob.of(Mentioned)[0]
            assert mentioned.message == message and mentioned.conversation == "team"
            assert not mentioned.here
            tombstone = Deleted(room="team", id=first.id + 1, target=first.id, user="ada", ts=1)
            assert apply_event(message, tombstone).mentions == ()  # as history shows it
            await asyncio.sleep(0.005)  # a later ts
            second = await ada.send("team", "again @bob.")

            page = await until_true(
                lambda: _if(bob.mentions(), lambda p: len(p.mentions) == 2)
            )  # stored a fraction of a second after delivery
            assert [(m.id, m.unread) for m in page.mentions] == [
                (second.id, True), (first.id, True)
            ]  # fmt: skip
            oldest = page.mentions[1]
            assert (oldest.room, oldest.peer, oldest.user, oldest.text, oldest.conversation) == (
                "team", None, "ada", "hey @bob, and @carol: look", "team"
            )  # fmt: skip
            assert (page.unread, page.more) == (2, False)
            newest = await bob.mentions(limit=1)
            assert ([m.id for m in newest.mentions], newest.more) == ([second.id], True)
            older = await bob.mentions(before=newest.mentions[0].ts, limit=1)
            assert ([m.id for m in older.mentions], older.more) == ([first.id], False)
            assert (await ada.mentions()).mentions == ()  # bob's, not ada's

            async def inbox_mentions(count: int) -> InboxEntry | None:
                inbox = await bob.inbox()
                entry = next(e for e in inbox.conversations if e.room == "team")
                return entry if entry.mentions == count else None

            assert (await until_true(lambda: inbox_mentions(2))).unread == 2
            assert bob.read("team", first.id)
            half = await until_true(lambda: _if(bob.mentions(), lambda p: p.unread == 1))
            assert [(m.id, m.unread) for m in half.mentions] == [
                (second.id, True), (first.id, False)
            ]  # fmt: skip
            assert (await until_true(lambda: inbox_mentions(1))).unread == 1
            assert bob.read("team", second.id)
            await until_true(lambda: _if(bob.mentions(), lambda p: p.unread == 0))
            assert (await until_true(lambda: inbox_mentions(0))).unread == 0

            here = await ada.send("team", "@here standup")
            await wait_until(lambda: len(seen_bob.of(Mentioned)) == 3)
            assert seen_bob.of(Mentioned)[-1].message.id == here.id
            assert seen_bob.of(Mentioned)[-1].here
            assert [m.message.id for m in seen_bob.of(Mentioned)] == [first.id, second.id, here.id]
            assert not seen_ada.of(Mentioned)  # never for one's own message


async def _if(answer: Awaitable[T], condition: Callable[[T], bool]) -> T | None:
    """``answer``'s value if it meets ``condition``, else None (for :func:`until_true`)."""
    value = await answer
    return value if condition(value) else None


@pytest.mark.timeout(60)
async def test_notification_levels_round_trip_and_visibility_is_said_again(
    tmp_path: Path,
) -> None:
    """Levels: a room nobody uses is ``not_found``; a room's default is ``mentions``, a direct
    conversation's ``all``; set (with a mute), read back, listed, unmuted with 0, per user;
    asked at once, each request gets its own answer (a refusal too); a level that does not
    exist never leaves the client. ``set_visible`` marks the connection on the server, and
    the client says it again on the connection after a reconnect."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/chat.db")
    async with run_server(settings) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        seen_ada = Seen(ada)
        async with ada, bob:
            with pytest.raises(HubbubError) as unused:  # as a private room to outsiders
                await ada.notification_level("team")
            assert unused.value.code == "not_found"
            await ada.join("team")
            room, peer, listed = await asyncio.gather(
                ada.notification_level("team"), ada.notification_level(DM("bob")),
                ada.notification_levels(),
            )  # fmt: skip
            assert room == NotificationSetting(room="team", level="mentions", mute_until=None)
            assert peer == NotificationSetting(peer="bob", level="all", mute_until=None)
            assert peer.conversation == DM("bob")
            assert listed == []

            until = int(time.time() * 1000) + 3_600_000
            muted = await ada.set_notification_level("team", "all", mute_until=until)
            assert (muted.room, muted.level, muted.mute_until) == ("team", "all", until)
            quiet = await ada.set_notification_level(DM("bob"), "none")
            assert (quiet.peer, quiet.level, quiet.mute_until) == ("bob", "none", None)
            assert (await ada.notification_level("team")).level == "all"
            assert sorted(await ada.notification_levels(), key=repr) == sorted(
                [
                    NotificationSetting(room="team", level="all", mute_until=until),
                    NotificationSetting(peer="bob", level="none", mute_until=None),
                ],
                key=repr,
            )
            assert await bob.notification_levels() == []  # per user
            unmuted = await ada.set_notification_level("team", mute_until=0)
            assert (unmuted.level, unmuted.mute_until) == ("all", None)

            # Refused: a conversation nobody uses (the refusal names it: each request gets its
            # own answer); a level that does not exist, a negative time (never sent).
            refused, after = await asyncio.gather(
                ada.notification_level("nowhere"), ada.notification_level("team"),
                return_exceptions=True,
            )  # fmt: skip
            assert isinstance(refused, HubbubError) and refused.code == "not_found"
            assert isinstance(after, NotificationSetting) and after.level == "all"
            with pytest.raises(ValueError):
                await ada.set_notification_level("team", "loud")  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                await ada.set_notification_level("team", mute_until=-1)
            with pytest.raises(ValueError):
                await ada.mentions(limit=0)
            assert (await ada.notification_level("team")).level == "all"
            assert not seen_ada.of(ServerError)  # each refusal answered its request

            assert connection_of(live, "ada").visible is False
            assert ada.set_visible(True) is True
            await wait_until(lambda: connection_of(live, "ada").visible)
            close_connections_of(live, "ada", CloseCode.SERVICE_RESTART)
            await wait_until(lambda: len(seen_ada.of(Hello)) == 2)
            # A new connection: not visible until the client says so, which it does.
            await wait_until(
                lambda: any(c.user == "ada" and c.visible for c in live.state.hub.connections)
            )
            assert ada.set_visible(False) is True
            await wait_until(lambda: not connection_of(live, "ada").visible)
            assert not seen_ada.of(ServerError)


@pytest.mark.timeout(60)
async def test_push_subscriptions_on_allowed_services_only(tmp_path: Path) -> None:
    """With Web Push on, ``hello`` brings the server's ``push_key``; a subscription on an
    allowed push service is taken and removed; one anywhere else is refused (``forbidden``),
    as is one without keys (before it leaves the client). Without Web Push: ``no_store``."""
    service = "https://push.example.invalid/wp/"
    private, public = generate_keys()
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/data/chat.db",
        vapid_private_key=private,
        push_services=[service],
    )
    user_agent = ec.generate_private_key(ec.SECP256R1()).public_key()
    keys = {
        "p256dh": _b64url(user_agent.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)),
        "auth": _b64url(os.urandom(16)),
    }
    async with run_server(settings) as live:
        async with sdk(live.ws_url(), "ada") as ada:
            assert ada.hello is not None and ada.hello.push_key == public
            endpoint = service + "abc123"
            subscription = {"endpoint": endpoint, "keys": keys, "expirationTime": None}
            assert await ada.subscribe_push(subscription) == endpoint
            assert await ada.unsubscribe_push(endpoint) == endpoint
            with pytest.raises(HubbubError) as elsewhere:
                await ada.subscribe_push({"endpoint": "https://attacker.example/p/1", "keys": keys})
            assert elsewhere.value.code == "forbidden"
            with pytest.raises(ValueError):
                await ada.subscribe_push({"endpoint": endpoint})
    async with run_server(make_settings(database_url=f"sqlite:///{tmp_path}/2.db")) as live:
        async with sdk(live.ws_url(), "ada") as ada:
            assert ada.hello is not None and ada.hello.push_key is None
            with pytest.raises(HubbubError) as off:
                await ada.subscribe_push({"endpoint": service + "x", "keys": keys})
            assert off.value.code == "no_store"


@pytest.mark.timeout(60)
async def test_block_and_mute_lists_refusals_and_another_connection_told(tmp_path: Path) -> None:
    """``mute``, ``block``, ``unmute``, ``unblock`` and ``hidden`` return the lists as they
    are now (blocking a muted user makes it a block, unmuting a blocked one leaves it); asked
    at once, each gets its own answer, the refusals too (yourself, a name that is none:
    ``bad_frame``); every answer is also a ``HiddenUsers`` event, and the user's other
    connection gets each change by itself. Without a store: ``no_store``, and empty lists."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/chat.db")
    async with run_server(settings) as live:
        ada, tab = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "ada")
        seen_ada, seen_tab = Seen(ada), Seen(tab)
        async with ada, tab:
            nobody = HiddenUsers(muted=(), blocked=())
            assert await ada.hidden() == nobody
            assert await ada.mute("bob") == HiddenUsers(muted=("bob",), blocked=())
            await wait_until(lambda: any(e.muted == ("bob",) for e in seen_tab.of(HiddenUsers)))
            assert await ada.block("carol") == HiddenUsers(muted=("bob",), blocked=("carol",))
            both = HiddenUsers(muted=(), blocked=("bob", "carol"))
            assert await ada.block("bob") == both
            assert await ada.unmute("bob") == both

            refused_self, unblocked, invalid, lists = await asyncio.gather(
                ada.mute("ada"), ada.unblock("bob"), ada.block("not a name!"), ada.hidden(),
                return_exceptions=True,
            )  # fmt: skip
            for refused in (refused_self, invalid):
                assert isinstance(refused, HubbubError) and refused.code == "bad_frame"
            assert unblocked == lists == HiddenUsers(muted=(), blocked=("carol",))
            assert await ada.unblock("carol") == nobody
            await wait_until(lambda: seen_tab.of(HiddenUsers)[-1] == nobody)
            assert await tab.hidden() == nobody
            # Every answer was an event too (8 here); the refusals answered their requests.
            await wait_until(lambda: len(seen_ada.of(HiddenUsers)) >= 8)
            assert seen_ada.of(HiddenUsers)[-1] == nobody
            assert not seen_ada.of(ServerError)
            received: list[HiddenUsers] = []
            ada.on("hidden", received.append)  # by name, as hubbub.js calls it
            await tab.mute("dan")
            await wait_until(lambda: [e.muted for e in received] == [("dan",)])
    async with run_server(make_settings()) as bare, sdk(bare.ws_url(), "ada") as ada:
        with pytest.raises(HubbubError) as no_store:
            await ada.mute("bob")
        assert no_store.value.code == "no_store"
        assert await ada.hidden() == HiddenUsers(muted=(), blocked=())


@pytest.mark.timeout(60)
async def test_reports_previews_and_the_moderators_calls(tmp_path: Path) -> None:
    """``report`` returns the report as stored (again: the same one); asked at once with a
    preview of a loopback link (``preview_unavailable``), a report of no message
    (``not_found``) and the moderators' calls (``forbidden`` to a user who is not one), each
    gets its own answer. A moderator's ``reports`` lists it, ``resolve`` deletes its message,
    ``kick`` closes the user's connection (4003)."""
    settings = make_settings(
        auth_mode="jwt", jwt_secret=SECRET, database_url=f"sqlite:///{tmp_path}/data/chat.db"
    )

    def as_user(user: str, **claims: Any) -> HubbubClient:
        def get_token() -> str:
            claims_now = {"sub": user, "exp": int(time.time()) + 60, **claims}
            return jwt.encode(claims_now, SECRET, "HS256")

        return sdk(live.ws_url(), get_token=get_token)

    async with run_server(settings) as live:
        ada, bob, mod = as_user("ada"), as_user("bob"), as_user("mod", roles=["moderator"])
        seen_ada, seen_bob = Seen(ada), Seen(bob)
        async with ada, bob, mod:
            for client in (ada, bob):
                await client.join("lobby")
            rude = await ada.send("lobby", "something rude")
            report = await bob.report("lobby", rude.id, "insulting")
            assert report["message"] == {"id": rude.id, "user": "ada", "text": "something rude"}
            assert (report.get("room"), report["reporter"], report["reason"]) == (
                "lobby", "bob", "insulting",
            )  # fmt: skip
            assert report["resolved"] is None
            again, missing, loopback, queue, resolve, kick, ban = await asyncio.gather(
                bob.report("lobby", rude.id, "again"),
                bob.report("lobby", rude.id + 1000, "no such message"),
                bob.preview("http://127.0.0.1:9/page"),
                bob.reports(),
                bob.resolve(report["id"], "dismiss"),
                bob.kick("ada"),
                bob.ban("ada", 60, "no reason"),
                return_exceptions=True,
            )
            assert again == report  # the first one, unchanged
            codes = [getattr(e, "code", e) for e in (missing, loopback, queue, resolve, kick, ban)]
            assert codes == ["not_found", "preview_unavailable", *["forbidden"] * 4]
            with pytest.raises(ValueError):
                await bob.reports(limit=0)
            with pytest.raises(ValueError):
                await bob.ban("ada", 0)
            assert not seen_bob.of(ServerError)  # the refusals answered their requests

            page = await mod.reports()
            assert [r["id"] for r in page["reports"]] == [report["id"]] and page["next"] is None
            done = await mod.resolve(report["id"], "delete")
            assert done["resolved"] is not None and done["resolved"]["outcome"] == "deleted"
            await wait_until(lambda: any(d.target == rude.id for d in seen_ada.of(Deleted)))
            assert (await mod.reports())["reports"] == []
            assert [r["id"] for r in (await mod.reports(resolved=True))["reports"]] == [
                report["id"]
            ]
            await mod.kick("bob", "cool down")
            assert await bob.wait_for_state("closed") == "closed"
            assert ("closed", 4003) in seen_bob.states()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.mark.timeout(60)
async def test_a_drain_close_reconnects_and_recovers_rooms_and_direct_messages() -> None:
    """The server closes ada's socket with 1012 (as a drain does): her client goes
    reconnecting (with the code), reconnects by itself, rejoins with ``since`` and fetches
    the direct messages sent meanwhile; every message reaches her once, in order."""
    async with run_server(make_settings()) as live:
        ada, bob = sdk(live.ws_url(), "ada", base_delay_s=0.5), sdk(live.ws_url(), "bob")
        seen = Seen(ada)
        async with ada, bob:
            await ada.join("d")
            await bob.join("d")
            await bob.send("d", "first")
            await bob.send_to("ada", "dm1")
            await wait_until(lambda: seen.texts("d") == ["first"] and bool(seen.of(DirectMessage)))
            close_connections_of(live, "ada", CloseCode.SERVICE_RESTART)
            await wait_until(lambda: ("reconnecting", 1012) in seen.states())
            await bob.send("d", "second")
            await bob.send_to("ada", "dm2")
            await wait_until(lambda: seen.states()[-1] == ("open", None))
            await wait_until(lambda: seen.texts("d") == ["first", "second"])
            await wait_until(lambda: [m.text for m in seen.of(DirectMessage)] == ["dm1", "dm2"])
            rejoined = seen.of(Joined)[-1]
            assert rejoined.recovered is True  # a join with since
            assert len(seen.of(Hello)) == 2
            change = next(c for c in seen.of(StateChange) if c.code == 1012)
            assert change.delay_s is not None and 0 < change.delay_s <= 0.5
            assert not seen.of(Resync)


@pytest.mark.timeout(120)
async def test_a_server_restart_loses_and_repeats_nothing(redis_server: RedisServer) -> None:
    """Two server processes on one Redis; ada's (A) is SIGKILLed while bob, on B, keeps
    sending, and restarted on its port. Ada's client reconnects by itself and rejoins with
    ``since``: the missed messages arrive once, in order. Her sends made while down are sent
    after the reconnect: one already published by her other connection (the same cid, its ack
    lost to her client) is deduplicated, the other published once. A room that missed more
    than the server replays (CHAT_RECOVERY_MAX_MESSAGES) gets a Resync, and is reloaded."""
    env = {"CHAT_REDIS_URL": redis_server.url, "CHAT_RECOVERY_MAX_MESSAGES": "5"}
    a, b = AppProcess(env), AppProcess(env)
    restarted = AppProcess(env, port=a.port)
    async with processes(a, b):
        ada = sdk(ws_url(a.port), "ada")
        seen = Seen(ada)
        async with ada, ChatClient.connect(b.ws_url("bob")) as bob:
            await ada.join("rec")
            await ada.join("lost")
            await bob.join("rec")
            await bob.join("lost")
            acks: dict[str, int] = {}
            await send_until_acked(bob, "rec", "before", acks)
            await wait_until(lambda: seen.texts("rec") == ["before"])
            await a.stop()  # SIGKILL: no close frame, the socket is just gone
            await wait_until(lambda: ada.state == "reconnecting")
            for k in range(3):
                await send_until_acked(bob, "rec", f"m{k}", acks)
            for k in range(6):
                await send_until_acked(bob, "lost", f"l{k}", acks)
            async with ChatClient.connect(b.ws_url("ada")) as other:
                await other.join("rec")
                await send_until_acked(other, "rec", "dup", acks)  # cid "dup"
            resent = ada.send("rec", "dup", cid="dup")
            fresh = ada.send("rec", "fresh")
            try:
                await restarted.start()
                async with asyncio.timeout(30):  # written once reconnected
                    dup_ack, fresh_ack = await resent, await fresh
                assert (dup_ack.id, dup_ack.duplicate) == (acks["dup"], True)
                assert not fresh_ack.duplicate
                expected = ["before", "m0", "m1", "m2", "dup", "fresh"]
                await wait_until(lambda: seen.texts("rec") == expected, 15)
                ids = [m.id for m in seen.of(Message) if m.room == "rec"]
                assert ids == sorted(ids) and len(set(ids)) == len(ids)
                assert ids[-1] == fresh_ack.id
                await wait_until(lambda: any(r.room == "lost" for r in seen.of(Resync)))
                assert [j.recovered for j in seen.of(Joined) if j.room == "rec"][-1] is True
                assert seen.texts("lost") == []
                reloaded = await ada.history("lost")
                assert [m.text for m in reloaded] == [f"l{k}" for k in range(6)]
                assert ada.last_id["lost"] == acks["l5"]
                assert ("reconnecting", 1006) in seen.states()
                assert seen.states()[-1] == ("open", None)
            finally:
                await restarted.stop()


@pytest.mark.timeout(90)
async def test_a_silent_server_is_noticed_by_the_ping_deadline(redis_server: RedisServer) -> None:
    """The server pings every second (0.5 s to answer); it is SIGSTOPped: alive, socket
    open, silent. A send meanwhile times out (AckTimeoutError, a TimeoutError); the client
    gives the link up within heartbeat_interval_s + heartbeat_timeout_s + slack of the
    server's last frame (close code 4000), and reconnects once the server is resumed."""
    env = {
        "CHAT_REDIS_URL": redis_server.url,
        "CHAT_HEARTBEAT_INTERVAL_S": "1",
        "CHAT_HEARTBEAT_TIMEOUT_S": "0.5",
    }
    app = AppProcess(env)
    async with processes(app):
        ada = sdk(ws_url(app.port), "ada", heartbeat_slack_s=0.5, ack_timeout_s=0.5)
        seen = Seen(ada)
        async with ada:
            await ada.join("quiet")
            first_hello = ada.hello
            app.signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            with pytest.raises(AckTimeoutError) as caught:
                await ada.send("quiet", "anyone?")
            assert isinstance(caught.value, TimeoutError)
            await wait_until(lambda: ("reconnecting", 4000) in seen.states(), 10)
            silent_for = time.monotonic() - stopped_at
            assert silent_for < 1 + 0.5 + 0.5 + 1, silent_for  # + a loaded machine's margin
            app.signal(signal.SIGCONT)
            await wait_until(lambda: seen.states()[-1] == ("open", None), 20)
            assert ada.hello is not first_hello
            rejoined = await ada.send("quiet", "back")
            assert not rejoined.duplicate


@pytest.mark.timeout(60)
async def test_the_server_keeps_a_client_that_answers_pings() -> None:
    """With pings every 0.2 s (0.1 s to answer) the client stays on one connection: it
    answers each ping (the server would close it with 4009 otherwise)."""
    async with run_server(make_settings(heartbeat_interval_s=0.2, heartbeat_timeout_s=0.1)) as live:
        ada = sdk(live.ws_url(), "ada")
        seen = Seen(ada)
        async with ada:
            conn = connection_of(live, "ada")
            greeted = conn.last_seen
            loop = asyncio.get_running_loop()
            # Pongs are all the client sends: the server hears from it again and again.
            await wait_until(lambda: conn.last_seen > greeted + 1.0, 5)
            assert loop.time() - conn.last_seen < 0.5
            assert not conn.closing and seen.states() == [("connecting", None), ("open", None)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["bad-token", "kicked"])
async def test_a_terminal_close_code_leaves_the_client_closed(how: str) -> None:
    """A bad token (4001) or a kick (4003): the client goes closed with the code and does
    not reconnect (its run loop is over; get_token was not asked again); what waits for an
    answer fails with ClientClosedError."""
    admin = "an-admin-token-that-is-long-enough-0123456789"
    if how == "bad-token":
        settings = make_settings(auth_mode="jwt", jwt_secret=SECRET)
    else:
        settings = make_settings(admin_token=admin)
    async with run_server(settings) as live:
        calls: list[float] = []

        def bad_token() -> str:
            calls.append(time.monotonic())
            return "not-a-jwt"

        if how == "bad-token":
            client = sdk(live.ws_url(), get_token=bad_token)
        else:
            client = sdk(live.ws_url(), "troll")
        seen = Seen(client)
        client.connect()
        if how == "kicked":
            await client.wait_open()
            async with httpx.AsyncClient() as http:
                kicked = await http.post(
                    f"{live.http_url}/admin/users/troll/kick",
                    headers={"Authorization": f"Bearer {admin}"},
                )
            assert kicked.status_code == 202
        code = CloseCode.AUTH_FAILED if how == "bad-token" else CloseCode.FORBIDDEN
        async with asyncio.timeout(10):
            assert await client.wait_for_state("closed") == "closed"
        await wait_until(lambda: ("closed", code) in seen.states())
        assert client._run_task is not None and client._run_task.done()
        assert ("reconnecting", code) not in seen.states()
        if how == "bad-token":
            assert len(calls) == 1
        with pytest.raises(ClientClosedError):
            await client.wait_open()
        with pytest.raises(ClientClosedError):
            await client.send("r", "too late")  # never written: fails at once
        await client.close()


@pytest.mark.timeout(60)
async def test_a_guest_keeps_the_key_the_server_made_across_reconnects() -> None:
    """``guest`` mode: without a key the server makes one (in ``hello``); the client keeps it
    and, after a reconnect, is the same user."""
    async with run_server(make_settings(auth_mode="guest")) as live:
        ada = sdk(live.ws_url(), "ada")
        seen = Seen(ada)
        async with ada:
            user, key = ada.user, ada.guest_key
            assert key is not None and user is not None and user.startswith("ada-")
            close_connections_of(live, user, CloseCode.SERVICE_RESTART)
            await wait_until(lambda: len(seen.of(Hello)) == 2)
            assert (ada.user, ada.guest_key) == (user, key)
            assert seen.of(Hello)[1].guest is None  # a known guest: no new key


@pytest.mark.timeout(60)
async def test_jwt_tokens_at_every_connect_and_on_refresh() -> None:
    """``get_token`` (a coroutine function here) gives the token of each connection, in
    the first frame: the URL carries only ``auth=frame``; a ``refresh`` from the server is
    answered with a new token (``authenticated``), and a reconnect asks for another."""
    settings = make_settings(auth_mode="jwt", jwt_secret=SECRET, token_refresh_before_s=59.0)
    async with run_server(settings) as live:
        tokens: list[str] = []

        async def get_token() -> str:
            token = jwt.encode(
                {"sub": "ada", "exp": int(time.time()) + 60, "n": len(tokens)}, SECRET, "HS256"
            )
            tokens.append(token)
            return token

        ada = sdk(f"{live.ws_url()}?auth=frame", get_token=get_token)
        seen = Seen(ada)
        async with ada:
            assert ada.user == "ada"
            await wait_until(lambda: [e.kind for e in seen.events].count("authenticated") == 1)
            assert len(tokens) == 2
            close_connections_of(live, "ada", CloseCode.SERVICE_RESTART)
            await wait_until(lambda: len(seen.of(Hello)) == 2)
            assert len(tokens) >= 3


@pytest.mark.timeout(60)
async def test_a_raising_or_slow_callback_does_not_hold_up_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One callback raises on every message, another blocks on the first one: the raise is
    logged, the connection keeps reading (an events() stream gets every message) and
    answering pings (the server, pinging every 0.2 s, keeps hearing from it), and once
    unblocked the slow callback gets every message, in order."""
    caplog.set_level(logging.ERROR, logger="hubbub_client")
    settings = make_settings(heartbeat_interval_s=0.2, heartbeat_timeout_s=0.1)
    async with run_server(settings) as live:
        ada, bob = sdk(live.ws_url(), "ada"), sdk(live.ws_url(), "bob")
        release = asyncio.Event()
        slow_got: list[str] = []

        def broken(message: Message) -> None:
            raise RuntimeError(f"callback bug on {message.text}")

        async def slow(message: Message) -> None:
            slow_got.append(message.text)
            await release.wait()

        ada.on(Message, broken)
        ada.on("message", slow)
        async with ada, bob, ada.events(Message) as stream:
            await ada.join("cb")
            await bob.join("cb")
            await bob.send("cb", "one")
            await wait_until(lambda: slow_got == ["one"])
            conn = connection_of(live, "ada")
            blocked_at = conn.last_seen
            await bob.send("cb", "two")
            await bob.send("cb", "three")
            async with asyncio.timeout(5):
                assert [(await anext(stream)).text for _ in range(3)] == ["one", "two", "three"]
            await wait_until(lambda: conn.last_seen > blocked_at + 1.0, 5)
            assert ada.state == "open" and not conn.closing
            release.set()
            await wait_until(lambda: slow_got == ["one", "two", "three"])
            raised = [r for r in caplog.records if "callback" in r.getMessage()]
            await wait_until(lambda: len([r for r in caplog.records if r.exc_info]) == 3)
            assert raised


@pytest.mark.timeout(60)
async def test_the_echo_bot_answers(tmp_path: Path) -> None:
    """The sample bot, run as its README says, answers ``!echo hi`` with ``hi`` (a reply),
    and nothing else."""
    async with run_server(make_settings()) as live:
        ada = sdk(live.ws_url(), "ada")
        seen = Seen(ada)
        with (tmp_path / "bot.log").open("w") as log:
            async with ada:
                await ada.join("lobby")
                bot = await asyncio.create_subprocess_exec(
                    sys.executable, str(ECHO_BOT), "--url", live.ws_url(), "--name", "bot",
                    "--room", "lobby", stdout=log, stderr=log,
                )  # fmt: skip
                try:
                    await wait_until(
                        lambda: any(
                            p.user == "bot" and p.event == "join" for p in seen.of(Presence)
                        ),
                        20,
                    )
                    await ada.send("lobby", "hello")
                    command = await ada.send("lobby", "!echo hi")
                    await wait_until(lambda: any(m.user == "bot" for m in seen.of(Message)), 10)
                    answers = [m for m in seen.of(Message) if m.user == "bot"]
                    assert [(m.text, m.reply_to) for m in answers] == [("hi", command.id)]
                finally:
                    bot.terminate()
                    await bot.wait()


async def test_the_readme_python_example_works_as_written(tmp_path: Path) -> None:
    """README's "Use it from Python" example, run as it is against a live server: it prints
    the send's ack."""
    readme = (ROOT / "README.md").read_text()
    example = readme.split("## Use it from Python", 1)[1].split("```python\n", 1)[1]
    example = example.split("```", 1)[0]
    async with run_server(make_settings()) as live:
        script = tmp_path / "example.py"
        script.write_text(example.replace("ws://127.0.0.1:8000/ws", live.ws_url()))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), stdout=asyncio.subprocess.PIPE
        )
        async with asyncio.timeout(30):
            out, _ = await proc.communicate()
    assert proc.returncode == 0
    printed = out.decode()
    assert printed.startswith("Ack(cid=") and "duplicate=False" in printed, printed
