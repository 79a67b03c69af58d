"""The chat page in a real Chromium (Debian's /usr/bin/chromium, driven by Playwright): two
people chat, a page survives its server's restart without losing or repeating a message,
markup in messages stays text, guests who share a name are told apart and invited only by
picking, invitations wait for consent, and the page works at phone width (screenshots are
saved in test-artifacts/)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2 as httpx
import pytest
from playwright.async_api import Browser, Page, WebSocket, async_playwright, expect
from redis.asyncio import Redis

from tests.helpers import ChatClient, LiveServer, make_settings, run_server, wait_until
from tests.processes import ROOT, AppProcess, NginxServer, RedisServer

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-quic", "--no-first-run", "--disable-default-apps", "--disable-extensions",
    "--metrics-recording-only", "--mute-audio",
]  # fmt: skip
UI_TIMEOUT_MS = 15_000


def label(user: str, known: list[str]) -> str:
    """How the page shows guest ``user`` among the ``known`` guests (chat.js's personLabel):
    the display name, "·" and the first 4 hex digits of its hash, more while another known
    guest with that name has the same ones."""
    name, digest = user[:-17], user[-16:]
    others = [other[-16:] for other in known if other != user and other[:-17] == name]
    digits = 4
    while digits < 16 and any(other[:digits] == digest[:digits] for other in others):
        digits += 1
    return f"{name}·{digest[:digits]}"


def frames_sent(chat: ChatPage, kind: str) -> list[dict[str, object]]:
    """The frames of type ``kind`` the page sent, on all its sockets."""
    frames = [json.loads(payload) for _, sent in chat.sockets for payload in sent]
    return [frame for frame in frames if frame.get("type") == kind]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: `make test` installs Debian's chromium"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=chromium, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()


class ChatPage:
    """One person's browser tab on the chat page, plus the JavaScript errors it logged."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        # Every WebSocket the page opens: its URL, and the frames it sent on it.
        self.sockets: list[tuple[str, list[str | bytes]]] = []
        page.on("websocket", self._opened)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on(
            "console",
            lambda message: self.errors.append(message.text) if message.type == "error" else None,
        )

    def _opened(self, socket: WebSocket) -> None:
        sent: list[str | bytes] = []
        self.sockets.append((socket.url, sent))
        socket.on("framesent", lambda payload: sent.append(payload))

    @classmethod
    async def open(
        cls, browser: Browser, base_url: str, name: str, room: str, width: int = 1200
    ) -> ChatPage:
        context = await browser.new_context(viewport={"width": width, "height": 800})
        chat = cls(await context.new_page())
        await chat.page.goto(f"{base_url}/?name={name}&room={room}")
        await chat.connected()
        await expect(chat.page.locator("#room-title")).to_have_text(room)
        return chat

    async def connected(self) -> None:
        await expect(self.page.locator("#status")).to_have_attribute(
            "data-state", "open", timeout=UI_TIMEOUT_MS
        )

    async def say(self, text: str) -> None:
        box = self.page.locator("#composer-input")
        await box.fill(text)
        await box.press("Enter")  # the keyboard, as people send

    async def shows(self, texts: list[str]) -> None:
        """The message list is exactly ``texts``, in that order (waits for it)."""
        await expect(self.page.locator("#messages .message .text")).to_have_text(
            texts, timeout=UI_TIMEOUT_MS
        )

    async def close(self) -> None:
        await self.page.context.close()
        assert not self.errors, f"JavaScript errors: {self.errors}"


async def test_two_people_chat_with_presence_and_typing(
    browser: Browser, server: LiveServer
) -> None:
    ada = await ChatPage.open(browser, server.http_url, "ada", "lobby")
    bob = await ChatPage.open(browser, server.http_url, "bob", "lobby")
    try:
        await ada.say("hello bob")
        await bob.shows(["hello bob"])
        await bob.say("hi ada")
        await ada.shows(["hello bob", "hi ada"])
        first = ada.page.locator("#messages .message").first
        await expect(first.locator(".author")).to_have_text("ada")
        assert await first.locator("time").get_attribute("datetime")  # a real timestamp
        # Presence: each sees both; typing shows on the other page.
        for page in (ada, bob):
            await expect(page.page.locator("#presence li")).to_have_text(["ada", "bob"])
        await bob.page.locator("#composer-input").press_sequentially("typ")
        await expect(ada.page.locator("#typing")).to_have_text("bob is typing…")
        # A refused frame is shown to the user, and the page goes on.
        await ada.page.evaluate("hubbub.client.leave('nowhere')")
        await expect(ada.page.locator("#alerts .alert")).to_contain_text("not_joined")
        # Joining another room from the keyboard, and leaving it.
        await ada.page.locator("#join-input").fill("side")
        await ada.page.locator("#join-input").press("Enter")
        await expect(ada.page.locator("#room-title")).to_have_text("side")
        await ada.say("only here")
        await ada.shows(["only here"])
        await ada.page.get_by_role("button", name="Leave side").click()
        await expect(ada.page.locator("#room-title")).to_have_text("lobby")
        await ada.shows(["hello bob", "hi ada"])
        await expect(bob.page.locator("#messages .message .text")).to_have_text(
            ["hello bob", "hi ada"]
        )

        ARTIFACTS.mkdir(exist_ok=True)
        await ada.page.screenshot(path=ARTIFACTS / "chat-desktop.png", full_page=True)
        assert (ARTIFACTS / "chat-desktop.png").stat().st_size > 10_000
    finally:
        await ada.close()
        await bob.close()


async def test_page_fits_a_phone(browser: Browser, server: LiveServer) -> None:
    phone = await ChatPage.open(browser, server.http_url, "pocket", "lobby", width=390)
    try:
        await phone.say("from my phone")
        await phone.shows(["from my phone"])
        overflow = await phone.page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"the page is {overflow}px wider than a phone"
        await expect(phone.page.locator("#composer-input")).to_be_in_viewport()
        ARTIFACTS.mkdir(exist_ok=True)
        await phone.page.screenshot(path=ARTIFACTS / "chat-phone.png", full_page=True)
        assert (ARTIFACTS / "chat-phone.png").stat().st_size > 5_000
    finally:
        await phone.close()


async def test_markup_in_messages_is_shown_as_text(browser: Browser, server: LiveServer) -> None:
    page = await ChatPage.open(browser, server.http_url, "mallory", "lobby")
    try:
        evil = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script><b>bold</b>'
        await page.say(evil)
        await page.shows([evil])
        assert await page.page.locator("#messages img, #messages script, #messages b").count() == 0
        assert await page.page.evaluate("window.pwned") is None
    finally:
        await page.close()


@pytest.mark.parametrize(
    "recovery", ["replayed", "reloaded", "quiet"], ids=["since-replay", "http-reload", "quiet-room"]
)
async def test_page_recovers_every_message_after_its_server_restarts(
    browser: Browser, redis_server: RedisServer, recovery: str
) -> None:
    """Two servers share Redis; ada's page is on A, bob's on B. A is restarted (drained with
    1012, down for a moment, back on the same port) while bob keeps sending: ada's page
    reconnects by itself and shows every message exactly once, in order — replayed with
    ``since``, or (when more were missed than the server replays) reloaded over HTTP. In a
    room where ada had seen no message yet (quiet), ``since`` is the ``last`` of her join."""
    env = {
        "CHAT_REDIS_URL": redis_server.url,
        "CHAT_DRAIN_WINDOW_S": "0.2",
        "CHAT_RECOVERY_MAX_MESSAGES": "2" if recovery == "reloaded" else "500",
    }
    a, b = AppProcess(env), AppProcess(env)
    await a.start()
    await b.start()
    ada = await ChatPage.open(browser, a.http_url, "ada", "rec")
    bob = await ChatPage.open(browser, b.http_url, "bob", "rec")
    restarted: AppProcess | None = None
    try:
        before = [] if recovery == "quiet" else ["before"]
        for text in before:
            await bob.say(text)
            await ada.shows([text])
        await ada.page.evaluate(
            "window.states = []; hubbub.client.addEventListener('state', e => "
            "states.push(e.detail.state + ':' + (e.detail.code ?? '')))"
        )
        texts = [f"m{k}" for k in range(20)]

        async def keep_sending() -> None:
            for text in texts:
                await bob.say(text)
                await asyncio.sleep(0.1)

        if recovery == "quiet":  # ada has seen no message in the room when A goes
            a.signal(signal.SIGTERM)  # drain: ada's socket gets 1012
            await a.wait()
            sending = asyncio.create_task(keep_sending())
            await asyncio.sleep(0.3)
        else:
            sending = asyncio.create_task(keep_sending())
            await asyncio.sleep(0.3)
            a.signal(signal.SIGTERM)
            await a.wait()
        restarted = AppProcess(env, port=a.port)
        await restarted.start()
        await sending
        await bob.shows([*before, *texts])
        await ada.shows([*before, *texts])  # each once, in order
        await ada.connected()
        states = await ada.page.evaluate("states")
        assert "reconnecting:1012" in states, states
    finally:
        with contextlib.suppress(Exception):
            await ada.close()
        await bob.close()
        for app in (a, b, restarted):
            if app is not None:
                await app.stop()


async def test_a_name_is_picked_in_a_dialog(browser: Browser, server: LiveServer) -> None:
    """Without a name the page asks for one (keyboard only), refuses an invalid one, then
    connects and joins the lobby."""
    context = await browser.new_context()
    page = ChatPage(await context.new_page())
    try:
        await page.page.goto(server.http_url)
        name = page.page.locator("#name-input")
        await expect(name).to_be_focused()
        await name.fill("no spaces!")
        await name.press("Enter")
        await expect(page.page.locator("#name-dialog")).to_be_visible()  # refused
        await name.fill("zoe")
        await name.press("Enter")
        await page.connected()
        await expect(page.page.locator("#me-name")).to_have_text("zoe")
        await expect(page.page.locator("#room-title")).to_have_text("lobby")
    finally:
        await page.close()


async def test_a_refused_join_is_tried_again(browser: Browser) -> None:
    """A join the server refuses for now (here the join quota: one join, then one a second)
    did not happen: the page's client sends it again, so the room is not silent until the
    next reconnect."""
    settings = make_settings(user_joins_per_s=1.0, user_join_burst=1)
    async with run_server(settings) as live:
        page = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        try:
            await page.page.locator("#join-input").fill("side")
            await page.page.locator("#join-input").press("Enter")  # refused: rate_limited
            await expect(page.page.locator("#alerts .alert")).to_contain_text("rate_limited")
            async with ChatClient.connect(live.ws_url("bob")) as bob:
                await bob.join("side")
                await wait_until(lambda: len(live.state.hub.members("side")) == 2, 10)
                await bob.say("side", "you made it")
                await page.shows(["you made it"])
        finally:
            await page.close()


async def test_guests_keep_their_identity_and_cannot_take_anothers(browser: Browser) -> None:
    """On a `guest` server the page shows display names; a browser is the same guest after a
    reload (its key is kept and sent in the first frame, never in a URL), and another browser
    with the same name is another user."""
    async with run_server(make_settings(auth_mode="guest")) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        other = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        try:
            first = await ada.page.evaluate("hubbub.client.hello.user")
            assert first.startswith("ada-")
            second = await other.page.evaluate("hubbub.client.hello.user")
            assert second != first
            # Her own name carries her suffix: she can tell others which ada she is.
            mine = label(first, [first, second])
            await expect(ada.page.locator("#me-name")).to_have_text(mine)
            await ada.say("still me")
            await ada.shows(["still me"])
            await ada.page.reload()
            await ada.connected()
            assert await ada.page.evaluate("hubbub.client.hello.user") == first
            key = await ada.page.evaluate("localStorage.getItem('hubbub.guest')")
            assert key and len(ada.sockets) == 2
            for url, _ in ada.sockets + other.sockets:
                assert key not in url and "guest=" not in url and "auth=frame" in url, url
            # The first socket learnt the key from `hello`; the next one began with it.
            assert json.loads(ada.sockets[0][1][0]) == {"type": "auth", "name": "ada"}
            assert json.loads(ada.sockets[1][1][0]) == {"type": "auth", "name": "ada", "guest": key}
            await expect(ada.page.locator("#messages .message .author")).to_have_text([mine])
            author = ada.page.locator("#messages .message .author").first
            assert await author.get_attribute("title") == first
        finally:
            await ada.close()
            await other.close()


async def test_stored_history_loads_on_scroll_and_direct_messages_wait_for_who_was_away(
    browser: Browser, tmp_path: Path
) -> None:
    """With a store (make run's SQLite): the broker keeps 20 messages of the room, the store
    all 120; scrolling up loads them all, in order. A DM sent while bob was away waits in his
    inbox: the page shows it with an unread badge, opening it marks it read, and his reply
    reaches ada."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db", history_size=20)
    async with run_server(settings) as live, ChatClient.connect(live.ws_url("ada")) as ada:
        state = live.state.store
        assert state is not None
        await ada.expect("inbox")
        await ada.join("lobby")
        for n in range(120):
            await ada.say("lobby", f"m{n}")
        await ada.say_to("bob", "are you there, bob?")
        # A room bob has read nothing of yet (it is in his inbox): two messages for him there.
        await state.inbox.mark_read("bob", "side", 0)
        await ada.send({"type": "join", "room": "side"})
        await ada.say("side", "s1")
        await ada.say("side", "s2")
        async with asyncio.timeout(20):
            while await state.messages.count("lobby") < 120 or not await state.messages.count(
                "@ada:bob"
            ):
                await asyncio.sleep(0.05)

        # Bob's browser was in two rooms: "side" (where two messages wait for him) and the
        # lobby, which he was reading: the page opens it.
        context = await browser.new_context(viewport={"width": 1200, "height": 800})
        await context.add_init_script(
            "localStorage.setItem('hubbub.rooms', JSON.stringify(['side', 'lobby']));"
            "localStorage.setItem('hubbub.active', 'lobby')"  # the one being read
        )
        bob = ChatPage(await context.new_page())
        await bob.page.goto(f"{live.http_url}/?name=bob")
        await bob.connected()
        await expect(bob.page.locator("#room-title")).to_have_text("lobby")
        try:
            texts = bob.page.locator("#messages .message .text")
            await expect(texts.last).to_have_text("m119", timeout=UI_TIMEOUT_MS)
            async with asyncio.timeout(30):
                while await texts.count() < 120:
                    await bob.page.evaluate("document.getElementById('messages').scrollTop = 0")
                    await asyncio.sleep(0.2)
            await bob.shows([f"m{n}" for n in range(120)])
            await expect(bob.page.locator("#history-state")).to_have_text(
                "Beginning of the conversation"
            )
            # The unread count of a room comes from the inbox (loading its history does not
            # count): "side" was shown only while the page started.
            side = bob.page.locator('#rooms li[data-room="side"]')
            await expect(side.locator(".unread")).to_have_text("2")
            # The lobby is read up to the newest message that was on screen for a second:
            # back at the bottom, its newest.
            await bob.page.evaluate(
                "(() => { const box = document.getElementById('messages');"
                " box.scrollTop = box.scrollHeight })()"
            )
            async with asyncio.timeout(10):
                while ("lobby", 0) not in [
                    (e.conversation, e.unread)
                    for e in await state.inbox.entries("bob", limit=10, unread_cap=999)
                ]:
                    await asyncio.sleep(0.1)

            dm = bob.page.locator('#dms li[data-room="@ada"]')
            await expect(dm.locator(".unread")).to_have_text("1")
            # A name in the room's presence list opens the conversation (guests' ids are not
            # what people type).
            await bob.page.locator("#presence").get_by_role("button", name="ada").click()
            await expect(bob.page.locator("#room-title")).to_have_text("@ada")
            await bob.shows(["are you there, bob?"])
            await expect(dm.locator(".unread")).to_be_hidden()
            await bob.say("back now")
            # Her own frames (rooms, her DM's copy, a join) come first.
            reply = await ada.next_frame()
            while reply.get("text") != "back now":
                reply = await ada.next_frame()
            assert (reply["type"], reply["to"], reply["user"]) == ("message", "ada", "bob")
            await bob.shows(["are you there, bob?", "back now"])  # his own copy, in place
            ARTIFACTS.mkdir(exist_ok=True)
            await bob.page.screenshot(path=ARTIFACTS / "chat-direct.png", full_page=True)
            # Opening it marked it read: the inbox says so.
            async with asyncio.timeout(10):
                while True:
                    inbox = await state.inbox.entries("bob", limit=10, unread_cap=999)
                    unread = {e.conversation: e.unread for e in inbox}
                    if unread == {"@ada:bob": 0, "lobby": 0, "side": 2}:
                        break
                    await asyncio.sleep(0.1)
        finally:
            await bob.close()


async def test_direct_messages_missed_while_disconnected_are_caught_up(
    browser: Browser, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Bob's page loses its socket twice while ada writes to him. The first time the client
    fetches what came after the last DM it had; the second time the conversation's history
    in Redis is gone as well (as after a day without messages), so that cannot be vouched
    for: the client loads the newest page instead. Either way the page shows every DM, once,
    in order."""
    settings = make_settings(
        redis_url=redis_server.url, database_url=f"sqlite:///{tmp_path}/data/hubbub.db"
    )
    async with run_server(settings) as live, ChatClient.connect(live.ws_url("ada")) as ada:
        await ada.expect("inbox")
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            await ada.say_to("bob", "one")
            dm = bob.page.locator('#dms li[data-room="@ada"]')
            await expect(dm.locator(".unread")).to_have_text("1", timeout=UI_TIMEOUT_MS)
            await dm.get_by_role("button", name="ada").click()
            await bob.shows(["one"])
            redis = Redis.from_url(redis_server.url)
            try:
                store = live.state.store
                assert store is not None
                for forget_history, text in ((False, "two"), (True, "three")):
                    # Bob's connection is gone while ada writes, then comes back.
                    await bob.page.evaluate("hubbub.client.close()")
                    await expect(bob.page.locator("#status")).to_have_attribute(
                        "data-state", "closed"
                    )
                    if forget_history:
                        # As a day without messages leaves it: stored, gone from Redis.
                        async with asyncio.timeout(10):
                            while await store.messages.count("@ada:bob") < 2:
                                await asyncio.sleep(0.05)
                        await redis.delete(*await redis.keys("hubbub:{r:@ada:bob}:*"))
                    await ada.say_to("bob", text)
                    await bob.page.evaluate("hubbub.client.connect()")
                    await bob.connected()
                    await expect(bob.page.locator("#messages .message .text").last).to_have_text(
                        text
                    )
                await bob.shows(["one", "two", "three"])
            finally:
                await redis.aclose()
        finally:
            await bob.close()


async def test_two_people_reply_edit_react_delete_and_see_who_read(
    browser: Browser, tmp_path: Path
) -> None:
    """With a store: bob replies to ada's message, ada edits it (his reply's quote follows),
    both react (the chip counts and shows whose), each sees "Seen by" the other, and bob
    deletes his reply: both pages show each change in place, from the other's action."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            await ada.say("helo wrld")
            await bob.shows(["helo wrld"])
            first = bob.page.locator("#messages .message").first
            await first.hover()
            await first.get_by_role("button", name="Reply").click()
            await expect(bob.page.locator("#composing-text")).to_have_text(
                "Replying to ada: helo wrld"
            )
            await bob.say("hi!")
            for page in (ada, bob):
                await page.shows(["helo wrld", "hi!"])
                reply = page.page.locator("#messages .message").nth(1)
                await expect(reply.locator(".quote")).to_have_text("↪ ada: helo wrld")
            await expect(bob.page.locator("#composing")).to_be_hidden()

            # Ada fixes her typo: her own message has Edit, bob's has not.
            mine = ada.page.locator("#messages .message").first
            await mine.hover()
            await expect(
                ada.page.locator("#messages .message").nth(1).get_by_role("button", name="Edit")
            ).to_have_count(0)
            await mine.get_by_role("button", name="Edit").click()
            await expect(ada.page.locator("#composer-input")).to_have_value("helo wrld")
            await ada.page.locator("#composer-input").fill("hello world")
            await ada.page.locator("#composer-input").press("Enter")
            for page in (ada, bob):
                await page.shows(["hello world", "hi!"])
                await expect(
                    page.page.locator("#messages .message").first.locator(".edited")
                ).to_be_visible()
                reply = page.page.locator("#messages .message").nth(1)
                await expect(reply.locator(".quote")).to_have_text("↪ ada: hello world")

            # Reactions: bob's 👍, then ada's on the same chip.
            first = bob.page.locator("#messages .message").first
            await first.hover()
            await first.get_by_role("button", name="React 👍").click()
            chip = ada.page.locator("#messages .message").first.locator(".reaction")
            await expect(chip).to_have_text("👍 1")
            await expect(chip).to_have_attribute("aria-pressed", "false")
            await chip.click()
            for page in (ada, bob):
                chip = page.page.locator("#messages .message").first.locator(".reaction")
                await expect(chip).to_have_text("👍 2")
            await expect(
                ada.page.locator("#messages .message").first.locator(".reaction")
            ).to_have_attribute("aria-pressed", "true")

            # Each page marks what it shows read; the other sees it under the newest message
            # they read that is not their own.
            await expect(
                ada.page.locator("#messages .message").first.locator(".seen")
            ).to_have_text("Seen by bob", timeout=UI_TIMEOUT_MS)
            await expect(
                bob.page.locator("#messages .message").nth(1).locator(".seen")
            ).to_have_text("Seen by ada", timeout=UI_TIMEOUT_MS)
            ARTIFACTS.mkdir(exist_ok=True)
            await ada.page.screenshot(path=ARTIFACTS / "chat-lifecycle.png", full_page=True)

            # Bob deletes his reply (after confirming): a tombstone on both pages.
            bob.page.once("dialog", lambda dialog: dialog.accept())
            reply = bob.page.locator("#messages .message").nth(1)
            await reply.hover()
            await reply.get_by_role("button", name="Delete").click()
            for page in (ada, bob):
                await page.shows(["hello world", "Message deleted"])
                await expect(page.page.locator("#messages .message.deleted")).to_have_count(1)
            # A page loaded now shows the same: history is the messages as they are now.
            cy = await ChatPage.open(browser, live.http_url, "cy", "lobby")
            try:
                await cy.shows(["hello world", "Message deleted"])
                chip = cy.page.locator("#messages .message").first.locator(".reaction")
                await expect(chip).to_have_text("👍 2")
                await expect(
                    cy.page.locator("#messages .message").first.locator(".edited")
                ).to_be_visible()
            finally:
                await cy.close()
        finally:
            await ada.close()
            await bob.close()


async def test_a_private_room_is_created_and_someone_invited_from_the_page(
    browser: Browser, tmp_path: Path
) -> None:
    """Ada creates a private room and invites bob (a `names` server: his name is his id); bob's
    page shows the invitation, he joins, and they talk there. Cy, not invited, is refused (with
    the room answer: not_found)."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            await ada.page.locator("#create-input").fill("plans")
            await ada.page.locator("#create-input").press("Enter")
            await expect(ada.page.locator("#room-title")).to_have_text("🔒 plans")
            await expect(ada.page.locator('#rooms li[data-room="plans"] .room')).to_have_text(
                "🔒 plans"
            )
            invite = ada.page.locator("#invite-input")
            await expect(invite).to_be_visible()  # she owns it
            await invite.fill("bob")
            await invite.press("Enter")
            await expect(bob.page.locator("#invitations .invitation")).to_contain_text(
                "ada invited you to 🔒 plans"
            )
            await bob.page.get_by_role("button", name="Join plans").click()
            plans = bob.page.locator('#rooms li[data-room="plans"] .room')
            await expect(plans).to_have_text("🔒 plans")
            await expect(bob.page.locator("#room-title")).to_have_text("🔒 plans")
            await expect(bob.page.locator("#invitations .invitation")).to_have_count(0)
            await expect(bob.page.locator("#invite-form")).to_be_hidden()  # a member
            await ada.say("the plan")
            await bob.shows(["the plan"])
            await bob.say("agreed")
            await ada.shows(["the plan", "agreed"])
            ARTIFACTS.mkdir(exist_ok=True)
            await ada.page.screenshot(path=ARTIFACTS / "chat-private-room.png", full_page=True)
            cy = await ChatPage.open(browser, live.http_url, "cy", "lobby")
            try:
                await cy.page.locator("#join-input").fill("plans")
                await cy.page.locator("#join-input").press("Enter")
                # The room answer: to an outsider a private room does not exist (not_found).
                await expect(cy.page.locator("#alerts .alert")).to_contain_text(
                    "You cannot join plans: room 'plans' not found"
                )
                await expect(cy.page.locator("#rooms li[data-room=plans]")).to_have_count(0)
            finally:
                await cy.close()
        finally:
            await ada.close()
            await bob.close()


async def test_namesakes_are_told_apart_invited_by_picking_and_join_only_with_consent(
    browser: Browser, tmp_path: Path
) -> None:
    """Issue 33, "privacy where features meet": two guests called alice (the second an
    impostor) and bob. Bob's page tells the alices apart everywhere (a suffix from each id, an
    avatar, a shared-name warning); typing "alice" into the invite box is refused and invites
    nobody; bob invites the real alice by picking her from the list. Her page shows the
    invitation and joins nothing until she clicks Join; another invitation she declines, and
    she is no longer a member. Twenty invitations at once (as the server sends them) stack:
    three shown, the rest counted, none joined."""
    settings = make_settings(auth_mode="guest", database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        alice = await ChatPage.open(browser, live.http_url, "alice", "lobby")
        impostor = await ChatPage.open(browser, live.http_url, "alice", "lobby")
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            pages = (alice, impostor, bob)
            users = [await c.page.evaluate("hubbub.client.hello.user") for c in pages]
            real, fake = users[:2]
            real_label, fake_label, bob_label = (label(user, users) for user in users)
            assert real_label != fake_label and real_label.startswith("alice·")

            # Told apart at a glance: presence (with the warning), authors, own names.
            await expect(bob.page.locator("#presence li")).to_have_text(
                [label(user, users) for user in sorted(users)], timeout=UI_TIMEOUT_MS
            )
            await expect(bob.page.locator("#name-warnings li")).to_have_text(
                ["⚠ 2 people are called alice"]
            )
            await expect(alice.page.locator("#me-name")).to_have_text(real_label)
            await expect(impostor.page.locator("#me-name")).to_have_text(fake_label)
            await alice.say("it's me")
            await bob.shows(["it's me"])
            await impostor.say("no, me")
            await bob.shows(["it's me", "no, me"])
            await expect(bob.page.locator("#messages .message .author")).to_have_text(
                [real_label, fake_label]
            )
            # An avatar each, its colour set through the CSSOM (a CSP violation would be a
            # console error: close() fails on those).
            hues = await bob.page.locator("#presence .avatar").evaluate_all(
                "nodes => nodes.map(node => node.style.getPropertyValue('--hue'))"
            )
            assert len(hues) == 3 and all(hue.isdigit() for hue in hues), hues

            await bob.page.locator("#create-input").fill("plans")
            await bob.page.locator("#create-input").press("Enter")
            await expect(bob.page.locator("#room-title")).to_have_text("🔒 plans")
            invite = bob.page.locator("#invite-input")
            # A typed name is never resolved to somebody: refused, nobody invited.
            await invite.fill("alice")
            await invite.press("Enter")
            await expect(bob.page.locator("#alerts")).to_contain_text(
                "Pick the person from the list: 2 people are called alice"
            )
            # Picked from the list (the options show the suffixes): the real alice's id.
            await invite.fill("ali")
            options = bob.page.locator("#invite-options [role=option]")
            await expect(options).to_have_text(sorted([real_label, fake_label]))
            await bob.page.get_by_role("option", name=real_label).click()
            await expect(invite).to_have_value(real_label)
            await invite.press("Enter")
            members = bob.page.locator("#room-members")
            await expect(members).to_contain_text(real_label)
            await expect(members).not_to_contain_text(fake_label)

            # Alice is asked; her page joins nothing by itself.
            card = alice.page.locator("#invitations .invitation")
            await expect(card).to_contain_text(f"{bob_label} invited you to 🔒 plans")
            assert frames_sent(bob, "invite") == [
                {"type": "invite", "room": "plans", "user": real, "role": "member"}
            ]
            await expect(impostor.page.locator("#invitations .invitation")).to_have_count(0)
            await asyncio.sleep(0.5)  # time enough for a page that joins by itself
            await expect(alice.page.locator('#rooms li[data-room="plans"]')).to_have_count(0)
            assert not [f for f in frames_sent(alice, "join") if f["room"] == "plans"]
            assert all(conn.user != real for conn in live.state.hub.members("plans"))
            await alice.page.get_by_role("button", name="Join plans").click()
            await expect(alice.page.locator("#room-title")).to_have_text("🔒 plans")
            await expect(card).to_have_count(0)
            await wait_until(
                lambda: any(conn.user == real for conn in live.state.hub.members("plans")), 10
            )
            await bob.say("welcome, the real alice")
            await alice.shows(["welcome, the real alice"])
            ARTIFACTS.mkdir(exist_ok=True)
            await bob.page.screenshot(path=ARTIFACTS / "chat-namesakes.png", full_page=True)

            # Declined: out of the members, as the owner's page shows.
            await bob.page.locator("#create-input").fill("secret")
            await bob.page.locator("#create-input").press("Enter")
            await expect(bob.page.locator("#room-title")).to_have_text("🔒 secret")
            await invite.fill("alice")
            await bob.page.get_by_role("option", name=real_label).click()
            await invite.press("Enter")
            await expect(members).to_contain_text(real_label)
            await expect(card).to_contain_text(f"{bob_label} invited you to 🔒 secret")
            await alice.page.get_by_role("button", name="Decline secret").click()
            await expect(card).to_have_count(0)
            await expect(members).not_to_contain_text(real_label)
            await expect(members).to_contain_text(bob_label)
            await expect(alice.page.locator('#rooms li[data-room="secret"]')).to_have_count(0)
            assert all(conn.user != real for conn in live.state.hub.members("secret"))

            # A flood of invitations (20 in a second) stacks, and joins nothing.
            await alice.page.evaluate(
                """by => { for (let n = 0; n < 20; n++) hubbub.client.dispatchEvent(
                    new CustomEvent("invited", {detail: {type: "invited", room: `flood${n}`,
                    private: true, title: "", topic: "", role: "member", by}})); }""",
                fake,
            )
            await expect(card).to_have_count(3)
            await expect(card.first).to_contain_text(f"{fake_label} invited you to 🔒 flood0")
            await expect(alice.page.locator("#invitations .invitation-more")).to_contain_text(
                "and 17 more invitations"
            )
            await asyncio.sleep(0.3)
            await expect(alice.page.locator('#rooms li[data-room^="flood"]')).to_have_count(0)
            assert not [f for f in frames_sent(alice, "join") if str(f["room"]).startswith("flood")]
            await alice.page.screenshot(path=ARTIFACTS / "chat-invitations.png", full_page=True)
        finally:
            await alice.close()
            await impostor.close()
            await bob.close()


async def test_where_websockets_are_blocked_the_page_chats_over_http(
    browser: Browser, redis_server: RedisServer
) -> None:
    """Through the repository's nginx with the WebSocket upgrade refused (as a proxy that
    blocks WebSockets does), the page falls back to the HTTP transport by itself, says so,
    and chats with a WebSocket user; gunicorn's two workers take the stream and its POSTs
    wherever nginx sends them."""
    app = AppProcess({"CHAT_REDIS_URL": redis_server.url}, gunicorn_workers=2)
    await app.start()
    refused = {"location = /ws {\n            proxy_pass http://hubbub;":
               "location = /ws {\n            return 403;"}  # fmt: skip
    nginx = NginxServer(f"127.0.0.1:{app.port}", refused)
    try:
        await nginx.start()
        ada = await ChatPage.open(browser, nginx.http_url, "ada", "lobby")
        try:
            status = ada.page.locator("#status")
            await expect(status).to_have_text("Connected (HTTP fallback)")
            await expect(status).to_have_attribute("data-transport", "sse")
            async with ChatClient.connect(app.ws_url("bob")) as bob:
                await bob.join("lobby")
                await bob.say("lobby", "hi ada")
                await ada.shows(["hi ada"])
                await ada.say("hi bob")
                await ada.shows(["hi ada", "hi bob"])
                while (await bob.next_frame(skip=("ping", "presence", "typing"))).get("text") != (
                    "hi bob"
                ):
                    pass
            # Its WebSocket tries (the first, and one more beside the open fallback) were
            # refused (the browser logs them), and sent nothing; the rest went over HTTP.
            tried = "Error during WebSocket handshake: Unexpected response code: 403"
            await wait_until(lambda: len([e for e in ada.errors if tried in e]) == 2)
            ada.errors = [e for e in ada.errors if tried not in e]
            assert len(ada.sockets) <= 2 and not any(sent for _, sent in ada.sockets)
            posts = [line for line in nginx.access_log() if line["path"] == "/sse"]
            assert {(line["method"], line["status"]) for line in posts} == {("POST", 202)}
        finally:
            await ada.close()
        # The stream is logged once it ends (the page is gone): one GET, answered 200.
        await wait_until(
            lambda: any(line["path"] == "/sse" and line["method"] == "GET" and
                        line["status"] == 200 for line in nginx.access_log()),
        )  # fmt: skip
    finally:
        await nginx.stop()
        await app.stop()


async def test_the_admin_page_finds_a_users_connections_and_disconnects_one(
    browser: Browser,
) -> None:
    """The admin page (/admin/), token typed in: it lists the worker, finds alice's two
    connections with their rooms, and its Disconnect button closes the one picked (4003)
    while the other stays; without the admin API the page is not there (404)."""
    token = "d" * 32
    async with run_server(make_settings(admin_token=token)) as server:
        async with (
            ChatClient.connect(server.ws_url("alice")) as first,
            ChatClient.connect(server.ws_url("alice")) as second,
        ):
            await first.join("lobby")
            context = await browser.new_context()
            tab = ChatPage(await context.new_page())
            await tab.page.goto(f"{server.http_url}/admin/")
            await tab.page.locator("#token").fill(token)
            await tab.page.get_by_role("button", name="Use").click()
            await expect(tab.page.locator("#workers tbody tr")).to_have_count(1)
            await expect(tab.page.locator("#workers tbody td").nth(3)).to_have_text("2")
            await tab.page.locator("#find-user").fill("alice")
            await tab.page.get_by_role("button", name="Find").click()
            rows = tab.page.locator("#connections tbody tr")
            await expect(rows).to_have_count(2)
            await expect(tab.page.locator("#status")).to_have_text("2 connections on 1 workers")
            lobby = rows.filter(has_text="lobby")
            await expect(lobby).to_have_count(1)
            await lobby.get_by_role("button", name="Disconnect").click()
            assert await first.closed_with() == 4003
            await expect(rows).to_have_count(1)
            assert second.ws.close_code is None
            await tab.close()
    async with run_server(make_settings()) as server, httpx.AsyncClient() as http:
        assert (await http.get(f"{server.http_url}/admin/")).status_code == 404
