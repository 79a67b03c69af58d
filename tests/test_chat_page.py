"""The chat page's promises, each against the bug it had, in a real Chromium: people are told
apart and picked (never resolved from a typed name), "Seen by" says what was really on
screen, nothing typed is lost (drafts per conversation, refused and offline sends kept), the
name dialog and the connection state say what happens, and the basics people expect
(formatting and links, grouping and the "New messages" line, any emoji as a reaction, a
phone drawer, files attached and shown)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from PIL import Image
from playwright.async_api import Browser, Route, expect

from app.notify.webpush import generate_keys
from tests.helpers import (
    ChatClient,
    Frame,
    LiveServer,
    free_port,
    make_settings,
    run_server,
    serving,
    wait_until,
)
from tests.processes import S3Server
from tests.test_access import jwt_settings, token
from tests.test_browser import UI_TIMEOUT_MS, ChatPage, browser, frames_sent, label
from tests.test_durable import store_of, wait_indexed, wait_stored
from tests.test_rooms import answer

__all__ = ["browser"]  # the fixture, imported for these tests

pytestmark = pytest.mark.timeout(90)

ROOM_HINT = "A room name is 1 to 64 letters, digits, _ . : or - (starting with a letter or digit)"


async def test_a_direct_message_goes_to_someone_picked_never_to_a_typed_name(
    browser: Browser,
) -> None:
    """On a guest server bob is ``bob-<hash>``: "bob" typed in the DM box opens nothing (it
    says to pick), and picking bob from the list opens the conversation that reaches him."""
    async with run_server(make_settings(auth_mode="guest")) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            bob_id = await bob.page.evaluate("hubbub.client.hello.user")
            ada_id = await ada.page.evaluate("hubbub.client.hello.user")
            await expect(ada.page.locator("#presence li")).to_have_count(2)
            box = ada.page.locator("#dm-input")
            await box.fill("bob")
            await box.press("Escape")  # the list closes; the text stays
            await ada.page.locator("#dm-form button[type=submit]").click()
            await expect(ada.page.locator("#alerts .alert")).to_contain_text("Pick the person")
            await expect(ada.page.locator("#dms li")).to_have_count(0)
            await box.fill("bo")
            await box.press("ArrowDown")
            await box.press("Enter")  # picks the highlighted bob
            await expect(box).to_have_value(label(bob_id, [bob_id, ada_id]))
            await box.press("Enter")  # opens the conversation
            await expect(ada.page.locator("#room-title")).to_contain_text(f"@{label(bob_id, [])}")
            await expect(ada.page.locator("#room-status")).to_have_text("● online")  # in lobby
            await ada.say("psst")
            await expect(bob.page.locator("#dms li")).to_have_count(1, timeout=UI_TIMEOUT_MS)
            direct = frames_sent(ada, "send")[-1]
            assert direct["to"] == bob_id and direct["text"] == "psst"
        finally:
            await ada.close()
            await bob.close()


async def set_visibility(chat: ChatPage, state: str) -> None:
    """Make the page's tab ``visible`` or ``hidden``, as switching tabs does."""
    await chat.page.evaluate(
        """state => {
          Object.defineProperty(document, "visibilityState", { value: state, configurable: true });
          document.dispatchEvent(new Event("visibilitychange"));
        }""",
        state,
    )


async def test_seen_by_says_what_was_on_screen_in_a_visible_page(
    browser: Browser, tmp_path: Path
) -> None:
    """A message that arrives while bob's tab is hidden is not marked read (nor "Seen by
    bob" on ada's page) until his tab is visible again; "Seen by" never lists a message's
    own author."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            await set_visibility(bob, "hidden")
            await ada.say("are you there?")
            await bob.shows(["are you there?"])
            await bob.page.wait_for_timeout(2_000)  # twice the page's read delay: nothing sent
            assert frames_sent(bob, "read") == []
            await set_visibility(bob, "visible")
            await expect(ada.page.locator("#messages .message .seen")).to_have_text(
                "Seen by bob", timeout=UI_TIMEOUT_MS
            )
            assert [frame["room"] for frame in frames_sent(bob, "read")] == ["lobby"]
            # Ada's page marked her own message read: bob's page knows, and does not say
            # she saw it ("Seen by" is for the others).
            await bob.page.wait_for_function(
                "hubbub.rooms.get('lobby').read.get('ada') > 0", timeout=UI_TIMEOUT_MS
            )
            await expect(bob.page.locator("#messages .message .seen")).to_be_hidden()
        finally:
            await ada.close()
            await bob.close()


async def test_drafts_are_kept_per_conversation_and_nothing_typed_is_lost(
    browser: Browser,
) -> None:
    """Each conversation has its own draft (kept over a reload, which shows the conversation
    being read); a text over the limit is counted and kept; a refused send stays as "Not
    sent" with its reason, and Edit puts it back in the composer."""
    settings = make_settings(max_text_chars=50, user_messages_per_s=0.05, user_message_burst=1)
    async with run_server(settings) as live:
        page = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        try:
            join = page.page.locator("#join-input")
            await join.fill("side")
            await join.press("Enter")
            await expect(page.page.locator("#room-title")).to_have_text("side")
            composer = page.page.locator("#composer-input")
            await composer.fill("for side")
            await page.page.locator("#rooms li", has_text="lobby").locator(".room").click()
            await expect(composer).to_have_value("")
            await composer.fill("for the lobby")
            await page.page.locator("#rooms li", has_text="side").locator(".room").click()
            await expect(composer).to_have_value("for side")
            await page.page.reload()
            await page.connected()
            await expect(page.page.locator("#room-title")).to_have_text("side")
            await expect(composer).to_have_value("for side")

            await composer.fill("x" * 51)
            await expect(page.page.locator("#counter")).to_have_text("51/50")
            await expect(page.page.locator("#counter")).to_have_class("counter over")
            await expect(page.page.locator("#send-button")).to_be_disabled()
            await composer.press("Enter")
            await expect(composer).to_have_value("x" * 51)

            await page.say("first")  # the burst: sent
            await page.shows(["first"])
            await page.say("second")  # over the user's message rate: refused
            failed = page.page.locator("#messages .message.pending.failed")
            await expect(failed).to_contain_text("second")
            await expect(failed).to_contain_text("Not sent")
            await expect(composer).to_have_value("")
            await failed.get_by_role("button", name="Back to the composer").click()
            await expect(composer).to_have_value("second")
            await expect(failed).to_have_count(0)
        finally:
            await page.close()


async def test_the_name_dialog_never_leaves_a_broken_page_and_warns_of_a_new_identity(
    browser: Browser, server: LiveServer
) -> None:
    """Esc before a name keeps the dialog (the page has nothing to do without one); a name
    change says it makes you someone else to everyone, and Esc then keeps who you are."""
    context = await browser.new_context()
    page = ChatPage(await context.new_page())
    try:
        await page.page.goto(server.http_url)
        name = page.page.locator("#name-input")
        await expect(name).to_be_focused()
        await name.press("Escape")
        await expect(page.page.locator("#name-dialog")).to_be_visible()
        await name.fill("no spaces!")
        await name.press("Enter")
        hint = await name.evaluate("input => input.validationMessage")
        assert hint.startswith("Use 1 to 15 letters"), hint
        await name.fill("zoe")
        await name.press("Enter")
        await page.connected()
        await page.page.locator("#change-name").click()
        warning = page.page.locator("#name-warning")
        await expect(warning).to_contain_text("makes you a different person")
        await name.press("Escape")
        await expect(page.page.locator("#name-dialog")).to_be_hidden()
        await page.say("still zoe")
        await page.shows(["still zoe"])
        await page.page.locator("#change-name").click()
        await name.fill("zed")
        await name.press("Enter")
        await page.connected()
        await expect(page.page.locator("#me-name")).to_have_text("zed")
        await expect(page.page.locator("#alerts .alert.info")).to_contain_text("You are now zed")
    finally:
        await page.close()


async def test_typing_ends_with_the_message_and_form_errors_say_what_is_wrong(
    browser: Browser, server: LiveServer
) -> None:
    """Bob's "typing" goes the moment his message arrives (not seconds later); a bad room
    name is answered with what a room name is."""
    page = await ChatPage.open(browser, server.http_url, "ada", "lobby")
    try:
        async with ChatClient.connect(server.ws_url("bob")) as bob:
            await bob.join("lobby")
            await bob.send({"type": "typing", "room": "lobby"})
            await expect(page.page.locator("#typing")).to_have_text("bob is typing…")
            await bob.say("lobby", "done typing")
            await page.shows(["done typing"])
            await expect(page.page.locator("#typing")).to_have_text("", timeout=1_000)
        join = page.page.locator("#join-input")
        await join.fill("no spaces!")
        await join.press("Enter")
        assert await join.evaluate("input => input.validationMessage") == ROOM_HINT
    finally:
        await page.close()


async def test_the_reconnect_countdown_ticks_and_says_why_in_words(
    browser: Browser, server: LiveServer
) -> None:
    """While the page waits to reconnect, the status counts down each second and says why
    the connection ended in words, never a bare close code."""
    page = await ChatPage.open(browser, server.http_url, "ada", "lobby")
    try:
        await page.page.evaluate(
            """() => hubbub.client.dispatchEvent(Object.assign(new Event("state"),
                 { detail: { state: "reconnecting", delayMs: 4000, code: 1012 } }))"""
        )
        status = page.page.locator("#status")
        await expect(status).to_have_text("Reconnecting in 4 s — the server is restarting")
        await expect(status).to_have_text("Reconnecting in 3 s — the server is restarting")
        await expect(status).not_to_contain_text("1012")
    finally:
        await page.close()


async def test_a_private_room_refused_leaves_the_sidebar_for_good(
    browser: Browser, tmp_path: Path
) -> None:
    """A saved (or linked) private room the page is refused goes from the sidebar and the
    saved rooms: the next visit does not ask for it again."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        async with ChatClient.connect(live.ws_url("owner")) as owner:
            await owner.send({"type": "create", "room": "secret", "private": True})
            assert (await owner.next_frame(5, skip=("ping", "inbox")))["type"] == "room"
            page = await ChatPage.open(browser, live.http_url, "eve", "lobby")
            try:
                await page.page.goto(f"{live.http_url}/?name=eve&room=secret")
                await page.connected()
                await expect(page.page.locator("#alerts .alert")).to_contain_text("secret")
                await expect(page.page.locator("#rooms li[data-room=secret]")).to_have_count(0)
                saved = await page.page.evaluate("localStorage.getItem('hubbub.rooms')")
                assert "secret" not in json.loads(saved)
                await page.page.goto(f"{live.http_url}/?name=eve")
                await page.connected()
                await expect(page.page.locator("#room-title")).to_have_text("lobby")
                joins = [frame["room"] for frame in frames_sent(page, "join")]
                assert joins.count("secret") == 1, joins  # asked once, never again
            finally:
                await page.close()


async def test_messages_are_formatted_grouped_and_the_unread_marked(
    browser: Browser, server: LiveServer
) -> None:
    """Links are links, **bold** and `code` are formatted (as elements, never markup from
    the text); one author's messages in a row are grouped under one name; a conversation
    opened with unread messages shows a "New messages" line before the first of them; any
    emoji can be a reaction."""
    page = await ChatPage.open(browser, server.http_url, "ada", "lobby")
    try:
        async with ChatClient.connect(server.ws_url("bob")) as bob:
            await bob.join("lobby")
            await bob.say("lobby", "see https://example.org/a_(b) and **this** `x < y`")
            await bob.say("lobby", "and this")
            await page.shows(["see https://example.org/a_(b) and this x < y", "and this"])
            link = page.page.locator("#messages .message .text a")
            await expect(link).to_have_attribute("href", "https://example.org/a_(b)")
            await expect(link).to_have_attribute("rel", "noopener noreferrer nofollow ugc")
            await expect(page.page.locator("#messages .message .text strong")).to_have_text("this")
            await expect(page.page.locator("#messages .message .text code")).to_have_text("x < y")
            await expect(page.page.locator("#messages .message").nth(1)).to_have_class(
                "message grouped"
            )
            await page.page.locator("#join-input").fill("side")
            await page.page.locator("#join-input").press("Enter")
            await expect(page.page.locator("#room-title")).to_have_text("side")
            await bob.say("lobby", "one")
            await bob.say("lobby", "two")
            lobby = page.page.locator("#rooms li", has_text="lobby")
            await expect(lobby.locator(".unread")).to_have_text("2")
            await lobby.locator(".room").click()
        await page.shows(["see https://example.org/a_(b) and this x < y", "and this", "one", "two"])
        # "one" and "two" were unread when the lobby was opened: the line is before "one".
        await expect(page.page.locator("#messages .new-divider + .message .text")).to_have_text(
            "one"
        )
        first = page.page.locator("#messages .message").first
        await first.hover()
        await first.get_by_role("button", name="React with another emoji").click()
        await page.page.locator("#emoji-other-input").fill("🦄")
        await page.page.locator("#emoji-other-input").press("Enter")
        await expect(first.locator(".reaction")).to_have_text("🦄 1")
    finally:
        await page.close()


async def test_on_a_phone_the_rooms_are_a_drawer_and_the_composer_stays_in_view(
    browser: Browser, server: LiveServer
) -> None:
    """At 390 by 844 pixels the sidebar is closed (the conversation has the screen, its composer in
    view); the Rooms button opens it, and picking a room closes it."""
    context = await browser.new_context(viewport={"width": 390, "height": 844})
    phone = ChatPage(await context.new_page())
    try:
        await phone.page.goto(f"{server.http_url}/?name=pocket&room=lobby")
        await phone.connected()
        await expect(phone.page.locator("#composer-input")).to_be_in_viewport()
        await expect(phone.page.locator("#sidebar")).not_to_be_in_viewport()
        await phone.page.locator("#drawer-toggle").click()
        await expect(phone.page.locator("#sidebar")).to_be_in_viewport()
        await expect(phone.page.locator("#drawer-toggle")).to_have_attribute(
            "aria-expanded", "true"
        )
        await phone.page.locator("#rooms li", has_text="lobby").locator(".room").click()
        await expect(phone.page.locator("#sidebar")).not_to_be_in_viewport()
    finally:
        await phone.close()


async def test_public_rooms_are_found_and_joined_from_the_page(
    browser: Browser, tmp_path: Path
) -> None:
    """The sidebar's search finds public rooms by name, title or topic (never a private one)
    and joins the one picked."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        async with ChatClient.connect(live.ws_url("owner")) as owner:
            for frame in (
                {"type": "create", "room": "town", "title": "Town square"},
                {"type": "create", "room": "tower", "private": True},
            ):
                await owner.send(frame)
                assert (await owner.next_frame(5, skip=("ping", "inbox")))["type"] == "room"
        page = await ChatPage.open(browser, live.http_url, "eve", "lobby")
        try:
            await page.page.locator("#find-input").fill("TOW")
            await page.page.locator("#find-input").press("Enter")
            found = page.page.locator("#found-rooms li")
            await expect(found).to_have_text(["town — Town squareJoin"])
            await found.get_by_role("button", name="Join town").click()
            await expect(page.page.locator("#room-title")).to_have_text("town — Town square")
            await expect(page.page.locator("#found-rooms")).to_be_hidden()
        finally:
            await page.close()


async def test_a_search_result_opens_its_conversation_at_the_message(
    browser: Browser, tmp_path: Path
) -> None:
    """The top bar's search finds messages (the words marked, as elements) in the rooms the
    page may read, never a private room it is not in; a result opens its room at the
    message, loading older pages until it is there."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        async with ChatClient.connect(live.ws_url("bob")) as bob:
            await bob.expect("inbox")  # sent after hello, with a store
            await bob.join("archive")
            await bob.say("archive", "the <b>zebra</b> crossing is closed")
            for n in range(60):  # more than a page after it
                await bob.say("archive", f"filler {n}")
            await answer(bob, {"type": "create", "room": "vault", "private": True}, "room")
            await answer(bob, {"type": "join", "room": "vault"}, "joined")
            await bob.say("vault", "zebra in the vault")
            await wait_stored(store_of(live), "archive", 61, timeout=20)
            await wait_indexed(live, "vault", 1, timeout=20)
        page = await ChatPage.open(browser, live.http_url, "eve", "lobby")
        try:
            await page.page.locator("#search-input").fill("ZEBRA")
            await page.page.locator("#search-input").press("Enter")
            results = page.page.locator("#search-list .search-result")
            await expect(results).to_have_count(1)
            await expect(results.locator(".result-text")).to_have_text(
                "the <b>zebra</b> crossing is closed"
            )
            await expect(results.locator("mark")).to_have_text("zebra")
            assert await page.page.locator("#search-list b").count() == 0
            await results.locator(".result-open").click()
            await expect(page.page.locator("#room-title")).to_have_text("archive")
            found = page.page.locator("#messages .message.found")
            await expect(found.locator(".text")).to_have_text("the <b>zebra</b> crossing is closed")
            await expect(found).to_be_in_viewport()
        finally:
            await page.close()


async def test_files_are_attached_with_progress_and_shown_to_the_other_person(
    browser: Browser, tmp_path: Path
) -> None:
    """Ada picks an image and a PDF (the file input the 📎 button opens): each is a chip with
    its name and a progress bar that fills; Send sends them with her text. Bob's page shows
    the image as a preview that really loaded under the page's CSP (naturalWidth), sized
    from the attachment to fit 320px and opening the full image, and the PDF as a row with
    its name, size, type and a download link that serves its bytes. A file removed (its
    Remove button) while it uploads is gone: the upload stops, Send waits no more, and the
    next message goes without it."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    photo, pdf, big = tmp_path / "photo.png", tmp_path / "minutes.pdf", tmp_path / "big.bin"
    Image.new("RGB", (800, 600), (200, 60, 30)).save(photo)
    pdf.write_bytes(b"%PDF-1.4\n% the minutes\n" + bytes(range(256)) * 64)
    big.write_bytes(os.urandom(1_000_000))
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            await expect(ada.page.get_by_role("button", name="Attach files")).to_be_enabled()
            await ada.page.locator("#file-input").set_input_files([photo, pdf])
            chips = ada.page.locator("#uploads .upload")
            await expect(chips).to_have_count(2)
            await expect(chips.locator(".upload-name")).to_have_text(["photo.png", "minutes.pdf"])
            for n, path in enumerate((photo, pdf)):
                size = path.stat().st_size
                bar = chips.nth(n).locator("progress")
                await expect(bar).to_have_attribute("max", str(size))
                await expect(chips.nth(n)).to_have_class("upload done", timeout=UI_TIMEOUT_MS)
                assert await bar.evaluate("bar => bar.value") == size
            await ada.page.locator("#composer-input").fill("the plans")
            await ada.page.locator("#send-button").click()
            await expect(chips).to_have_count(0)
            await bob.shows(["the plans"])
            sent = frames_sent(ada, "send")[-1]
            assert sent["text"] == "the plans" and len(sent["attachments"]) == 2  # type: ignore[arg-type]

            message = bob.page.locator("#messages .message").last
            preview = message.locator("a.attachment-image")
            image = preview.locator("img")
            await expect(image).to_have_attribute("alt", "photo.png")
            await expect(image).to_have_attribute("loading", "lazy")
            await expect(image).to_have_attribute("width", "320")  # 800x600 fits 320px
            await expect(image).to_have_attribute("height", "240")
            await expect(image).to_have_attribute("src", re.compile(r"/files/[\w-]+\.thumb\?"))
            await bob.page.wait_for_function(
                "img => img.complete && img.naturalWidth > 0",
                arg=await image.element_handle(),
                timeout=UI_TIMEOUT_MS,
            )
            await expect(preview).to_have_attribute("target", "_blank")
            await expect(preview).to_have_attribute("rel", "noopener")
            full = await preview.get_attribute("href")
            assert full is not None and full.startswith(f"{live.http_url}/files/")
            got = await bob.page.request.get(full)
            assert got.ok and await got.body() == photo.read_bytes()

            row = message.locator(".attachment-file")
            await expect(row.locator(".file-name")).to_have_text("minutes.pdf")
            await expect(row.locator(".file-meta")).to_have_text("16 KB · PDF")
            download = row.get_by_role("link", name="Download minutes.pdf")
            await expect(download).to_have_attribute("href", re.compile(r"/files/[\w-]+\?"))
            got = await bob.page.request.get(await download.get_attribute("href") or "")
            assert got.ok and await got.body() == pdf.read_bytes()
            assert got.headers["content-disposition"].startswith("attachment;")

            # Removed while its bytes are on their way (held here): it is gone for good.
            held, release = asyncio.Event(), asyncio.Event()

            async def hold(route: Route) -> None:
                if route.request.method == "PUT":
                    held.set()
                    await release.wait()
                with contextlib.suppress(Exception):  # the aborted upload has no one to answer
                    await route.continue_()

            failed: list[str] = []
            ada.page.on(
                "requestfailed",
                lambda request: failed.append(request.url) if request.method == "PUT" else None,
            )
            await ada.page.route("**/files/*", hold)
            await ada.page.locator("#file-input").set_input_files(big)
            await expect(chips).to_have_count(1)
            await asyncio.wait_for(held.wait(), UI_TIMEOUT_MS / 1000)
            await expect(chips.first).to_have_class("upload")  # not done
            await expect(chips.first.locator("progress")).to_have_attribute(
                "aria-label", "Uploading big.bin"
            )
            await expect(ada.page.locator("#send-button")).to_be_disabled()  # Send waits
            await chips.first.get_by_role("button", name="Remove big.bin").click()
            await expect(chips).to_have_count(0)
            assert await ada.page.locator("#uploads").is_hidden()
            async with asyncio.timeout(UI_TIMEOUT_MS / 1000):  # the upload was aborted
                while not failed:
                    await asyncio.sleep(0.05)
            release.set()
            await ada.say("no file after all")
            await bob.shows(["the plans", "no file after all"])
            assert "attachments" not in frames_sent(ada, "send")[-1]
            last = bob.page.locator("#messages .message").last
            await expect(last.locator(".attachment")).to_have_count(0)
            kept = [p.stat().st_size for p in (tmp_path / "data" / "files").iterdir()]
            assert big.stat().st_size not in kept  # its bytes never reached the storage
            await ada.page.unroute("**/files/*")
        finally:
            await ada.close()
            await bob.close()


async def test_files_dropped_on_the_conversation_or_pasted_are_attached(
    browser: Browser, tmp_path: Path
) -> None:
    """A file dropped on the conversation and a screenshot pasted into the composer each
    become a chip that uploads, and Send sends both; a paste of rich text (HTML beside the
    file) is left to the browser: no chip."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        try:
            await expect(ada.page.get_by_role("button", name="Attach files")).to_be_enabled()
            await ada.page.evaluate(
                """() => {
                  const drop = new DataTransfer();
                  drop.items.add(new File(["dropped notes"], "notes.txt", {type: "text/plain"}));
                  const chat = document.querySelector("main.chat");
                  for (const type of ["dragenter", "dragover", "drop"]) {
                    chat.dispatchEvent(new DragEvent(type, {dataTransfer: drop, bubbles: true,
                                                            cancelable: true}));
                  }
                  const rich = new DataTransfer();
                  rich.items.add(new File(["x"], "inline.png", {type: "image/png"}));
                  rich.setData("text/html", "<p>copied from a page</p>");
                  const box = document.querySelector("#composer-input");
                  box.dispatchEvent(new ClipboardEvent("paste", {clipboardData: rich,
                                                                 bubbles: true, cancelable: true}));
                }"""
            )
            chips = ada.page.locator("#uploads .upload")
            await expect(chips.locator(".upload-name")).to_have_text(["notes.txt"])
            shot = io.BytesIO()
            Image.new("RGB", (64, 48), (20, 90, 200)).save(shot, "PNG")
            await ada.page.evaluate(
                """(bytes) => {
                  const paste = new DataTransfer();
                  paste.items.add(new File([new Uint8Array(bytes)], "image.png",
                                           {type: "image/png"}));
                  document.querySelector("#composer-input").dispatchEvent(
                    new ClipboardEvent("paste", {clipboardData: paste, bubbles: true,
                                                 cancelable: true}));
                }""",
                list(shot.getvalue()),
            )
            await expect(chips.locator(".upload-name")).to_have_text(["notes.txt", "image.png"])
            for n in range(2):
                await expect(chips.nth(n)).to_have_class("upload done", timeout=UI_TIMEOUT_MS)
            await ada.page.locator("#send-button").click()
            await expect(chips).to_have_count(0)
            sent = frames_sent(ada, "send")[-1]
            assert len(sent["attachments"]) == 2  # type: ignore[arg-type]
            message = ada.page.locator("#messages .message").last
            await expect(message.locator(".attachment-file .file-name")).to_have_text("notes.txt")
            await expect(message.locator("a.attachment-image img")).to_have_attribute(
                "alt", "image.png"
            )
        finally:
            await ada.close()


async def test_files_go_to_an_s3_bucket_and_show_from_it(
    browser: Browser, tmp_path: Path, s3_server: S3Server
) -> None:
    """With S3 storage (as docker compose runs it): the page uploads straight to the bucket
    (a presigned POST, across origins, allowed by the page's CSP and the bucket's CORS), and
    the other person's page shows the thumbnail from the bucket and downloads the original
    from it."""
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/data/hubbub.db", **s3_server.settings()
    )
    photo = tmp_path / "photo.png"
    Image.new("RGB", (640, 480), (30, 120, 60)).save(photo)
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            posted: list[str] = []
            ada.page.on(
                "requestfinished",
                lambda request: posted.append(request.url) if request.method == "POST" else None,
            )
            await ada.page.locator("#file-input").set_input_files(photo)
            chip = ada.page.locator("#uploads .upload")
            await expect(chip).to_have_class("upload done", timeout=UI_TIMEOUT_MS)
            assert any(url.startswith(s3_server.endpoint) for url in posted), posted
            await ada.page.locator("#composer-input").fill("from the bucket")
            await ada.page.locator("#send-button").click()
            await bob.shows(["from the bucket"])
            image = bob.page.locator("#messages .message").last.locator("a.attachment-image img")
            await expect(image).to_have_attribute(
                "src", re.compile(re.escape(s3_server.endpoint)), timeout=UI_TIMEOUT_MS
            )
            await bob.page.wait_for_function(
                "img => img.complete && img.naturalWidth > 0",
                arg=await image.element_handle(),
                timeout=UI_TIMEOUT_MS,
            )
            full = await bob.page.locator("a.attachment-image").last.get_attribute("href")
            assert full is not None and full.startswith(s3_server.endpoint)
            got = await bob.page.request.get(full)
            assert got.ok and await got.body() == photo.read_bytes()
        finally:
            await ada.close()
            await bob.close()


# -- mentions and notifications (docs/protocol.md, "Mentions and notifications") -------------


# Counts the page's showNotification calls, and those that settled (the page runs unchanged).
# Chromium's getNotifications() forgets a notification still being shown when it runs (one
# not displayed yet at its start: taken for one the person closed), so the tests read the
# notifications once, after every one shown has settled, never while one is on its way.
COUNT_SHOWN = """(() => {
  const show = ServiceWorkerRegistration.prototype.showNotification;
  const calls = { made: 0, settled: 0 };
  Object.defineProperty(window, "hubbubShown", { value: calls });
  ServiceWorkerRegistration.prototype.showNotification = function (...args) {
    calls.made += 1;
    return show.apply(this, args).finally(() => { calls.settled += 1; });
  };
})();"""


async def notifying_page(browser: Browser, base_url: str, name: str, room: str) -> ChatPage:
    """A tab whose person allowed notifications (the browser's permission), then pressed the
    page's "Enable notifications": its service worker is registered and active."""
    context = await browser.new_context(viewport={"width": 1200, "height": 800})
    await context.grant_permissions(["notifications"], origin=base_url)
    await context.add_init_script(COUNT_SHOWN)
    chat = ChatPage(await context.new_page())
    await chat.page.goto(f"{base_url}/?name={name}&room={room}")
    await chat.connected()
    await expect(chat.page.locator("#room-title")).to_have_text(room)
    state = chat.page.locator("#notify-state")
    await expect(state).not_to_contain_text("Notifications are on")  # never asked on load
    await chat.page.get_by_role("button", name="Enable notifications").click()
    await expect(state).to_contain_text("Notifications are on")
    await page_holds(chat, "navigator.serviceWorker.controller !== null")
    return chat


async def page_holds(chat: ChatPage, expression: str, timeout: float = 10) -> None:
    """Until ``expression`` is true in the page (evaluated from outside: polling in the page
    would need eval, which its Content-Security-Policy refuses)."""
    async with asyncio.timeout(timeout):
        while not await chat.page.evaluate(expression):
            await asyncio.sleep(0.05)


async def shown_notifications(chat: ChatPage) -> list[dict[str, Any]]:
    """The notifications the page's service worker registration shows now."""
    shown: list[dict[str, Any]] = await chat.page.evaluate(
        """async () => {
          const registration = await navigator.serviceWorker.getRegistration("/");
          const shown = registration ? await registration.getNotifications() : [];
          return shown.map((n) => ({ title: n.title, body: n.body, tag: n.tag, data: n.data }));
        }"""
    )
    return shown


async def notifications_until(chat: ChatPage, count: int, timeout: float = 10) -> list[Frame]:
    """The notifications shown, once the page showed at least ``count`` and none is still on
    its way (read then, and only then: see COUNT_SHOWN)."""
    await page_holds(
        chat,
        f"hubbubShown.made >= {count} && hubbubShown.settled === hubbubShown.made",
        timeout,
    )
    return await shown_notifications(chat)


async def test_at_offers_the_rooms_people_and_the_mentioned_sees_it_and_its_list(
    browser: Browser, tmp_path: Path
) -> None:
    """On a guest server two people are called bob: "@bo" in ada's composer lists both (a
    listbox under the ARIA combobox pattern), each with its id; the arrow keys and Enter pick
    the one on the page, which inserts "@<id> ". That bob, reading another room, sees the
    lobby's "@1" badge, the sidebar's Mentions count and the tab's "(@1)"; the Mentions list
    has the message, unread, and opens the lobby at it: highlighted, his name a chip."""
    settings = make_settings(auth_mode="guest", database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            async with ChatClient.connect(live.ws_url("bob")) as other:
                bob_id = await bob.page.evaluate("hubbub.client.hello.user")
                other_id = other.hello["user"]
                await other.expect("inbox")  # sent after hello, with a store
                await other.join("lobby")
                await other.say("lobby", "the other bob")
                await bob.say("hi, bob here")
                await ada.shows(["the other bob", "hi, bob here"])
                await wait_stored(store_of(live), "lobby", 2, timeout=10)  # both took part
                await bob.page.locator("#join-input").fill("side")
                await bob.page.locator("#join-input").press("Enter")
                await expect(bob.page.locator("#room-title")).to_have_text("side")

                box = ada.page.locator("#composer-input")
                options = ada.page.locator("#mention-options [role=option]")
                await box.press_sequentially("@bo")
                await expect(box).to_have_attribute("aria-expanded", "true")
                await expect(options).to_have_count(2)
                users = [await option.get_attribute("data-user") for option in await options.all()]
                assert sorted(users) == sorted([bob_id, other_id])  # type: ignore[type-var]
                for option, user in zip(await options.all(), users, strict=True):
                    await expect(option.locator(".option-id")).to_have_text(user or "")
                await expect(options.first).to_have_attribute("aria-selected", "true")
                for _ in range(users.index(bob_id)):
                    await box.press("ArrowDown")
                chosen = options.nth(users.index(bob_id))
                await expect(chosen).to_have_attribute("aria-selected", "true")
                await expect(box).to_have_attribute(
                    "aria-activedescendant", await chosen.get_attribute("id") or ""
                )
                await box.press("Enter")  # picks: does not send
                await expect(box).to_have_value(f"@{bob_id} ")
                await expect(ada.page.locator("#mention-options")).to_be_hidden()
                await expect(box).to_have_attribute("aria-expanded", "false")
                await box.press_sequentially("look @")
                await expect(options).to_have_count(3)  # both bobs and @here
                await box.press("Escape")
                await expect(ada.page.locator("#mention-options")).to_be_hidden()
                await box.press("Backspace")
                await box.press("Enter")
                assert frames_sent(ada, "send")[-1]["text"] == f"@{bob_id} look"

            lobby = bob.page.locator("#rooms li[data-room=lobby]")
            await expect(lobby.locator(".mention-badge")).to_have_text("@1 mention")
            await expect(bob.page.locator("#mentions-count")).to_have_text("1 unread")
            await expect(bob.page).to_have_title("(@1) Hubbub")
            await wait_stored(store_of(live), "lobby", 3, timeout=10)
            await bob.page.locator("#mentions-open").click()
            assert frames_sent(bob, "mentions")[-1] == {"type": "mentions", "limit": 20}
            found = bob.page.locator("#mentions-list .mention-result")
            await expect(found).to_have_count(1)
            await expect(found).to_have_class(re.compile(r"\bunread\b"))
            await expect(found.locator(".result-head")).to_contain_text("Unread")
            await expect(found.locator(".result-head strong")).to_have_text("lobby")
            await expect(found.locator(".result-text")).to_have_text(f"@{bob_id} look")
            await found.locator(".result-open").click()
            await expect(bob.page.locator("#room-title")).to_have_text("lobby")
            message = bob.page.locator("#messages .message.found")
            await expect(message).to_have_class(re.compile(r"\bmentioned\b"))
            await expect(message).to_be_in_viewport()
            chip = message.locator(".text .mention.me")
            await expect(chip).to_have_text(f"@{label(bob_id, [bob_id, other_id])}")
            await expect(chip).to_have_attribute("title", bob_id)
            await expect(bob.page.locator("#mentions-count")).to_be_hidden()
            await expect(bob.page).to_have_title("Hubbub")
            # Ada's own view: not highlighted (it is not for her), the chip still a chip.
            mine = ada.page.locator("#messages .message").last
            await expect(mine).not_to_have_class(re.compile(r"\bmentioned\b"))
            await expect(mine.locator(".text .mention")).to_have_count(1)
        finally:
            await ada.close()
            await bob.close()


async def test_the_tab_title_counts_unread_and_marks_mentions(
    browser: Browser, tmp_path: Path
) -> None:
    """ "(N) Hubbub": the unread messages of every conversation, "(@N)" while one of them
    mentions you, kept over a reload (the inbox counts mentions apart); opening the room
    clears it. With the tab hidden, messages into the room on screen count until it is seen."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        try:
            await ada.say("hello")
            await ada.shows(["hello"])
            await wait_stored(store_of(live), "lobby", 1, timeout=10)
            await wait_until(lambda: bool(frames_sent(ada, "read")), timeout=10)  # read it
            await ada.page.locator("#join-input").fill("side")
            await ada.page.locator("#join-input").press("Enter")
            await expect(ada.page.locator("#room-title")).to_have_text("side")
            await expect(ada.page).to_have_title("Hubbub")
            lobby = ada.page.locator("#rooms li[data-room=lobby]")
            async with ChatClient.connect(live.ws_url("bob")) as bob:
                await bob.expect("inbox")  # sent after hello, with a store
                await bob.join("lobby")
                await bob.say("lobby", "one")
                await bob.say("lobby", "two")
                await expect(ada.page).to_have_title("(2) Hubbub")
                await expect(lobby.locator(".mention-badge")).to_be_hidden()
                await bob.say("lobby", "@ada three")
                await expect(ada.page).to_have_title("(@3) Hubbub")
                await expect(lobby.locator(".unread")).to_have_text("3")
                await expect(lobby.locator(".mention-badge")).to_have_text("@1 mention")
                await wait_stored(store_of(live), "lobby", 4, timeout=10)
                await ada.page.reload()
                await ada.connected()
                await expect(ada.page.locator("#room-title")).to_have_text("side")
                await expect(lobby.locator(".mention-badge")).to_have_text("@1 mention")
                await expect(ada.page).to_have_title("(@3) Hubbub")
                await lobby.locator(".room").click()
                await expect(ada.page).to_have_title("Hubbub")
                await expect(lobby.locator(".mention-badge")).to_be_hidden()

                await set_visibility(ada, "hidden")
                await bob.say("lobby", "four")
                await ada.shows(["hello", "one", "two", "@ada three", "four"])
                await expect(ada.page).to_have_title("(1) Hubbub")
                await set_visibility(ada, "visible")
                await expect(ada.page).to_have_title("Hubbub")
        finally:
            await ada.close()


async def test_visibility_is_said_on_changes_and_on_every_connection(
    browser: Browser,
) -> None:
    """The page says it is visible once connected (in view, just used), hidden when its tab
    is, visible again when it is back, idle after 5 minutes without a pointer, key or focus
    and visible at the next; only changes are sent, and a new connection is told again."""
    settings = make_settings(heartbeat_interval_s=900, heartbeat_timeout_s=10)
    async with run_server(settings) as live:
        context = await browser.new_context()
        chat = ChatPage(await context.new_page())
        await chat.page.clock.install()
        try:
            await chat.page.goto(f"{live.http_url}/?name=ada&room=lobby")
            await chat.connected()

            def said() -> list[object]:
                return [frame["visible"] for frame in frames_sent(chat, "visibility")]

            await wait_until(lambda: said() == [True], timeout=10)
            for x in range(5):  # in use: nothing new to say
                await chat.page.mouse.move(10 + x, 10)
            await set_visibility(chat, "hidden")
            await wait_until(lambda: said() == [True, False], timeout=10)
            await set_visibility(chat, "visible")
            await wait_until(lambda: said() == [True, False, True], timeout=10)
            await chat.page.clock.fast_forward("05:01")  # no pointer, key or focus since
            await wait_until(lambda: said() == [True, False, True, False], timeout=10)
            await chat.page.mouse.move(50, 50)
            await wait_until(lambda: said() == [True, False, True, False, True], timeout=10)
            await chat.page.mouse.move(60, 60)

            await chat.page.evaluate("hubbub.client.ws.close()")  # the connection drops
            await wait_until(lambda: len(chat.sockets) == 2, timeout=10)
            await chat.connected()
            _, on_new = chat.sockets[-1]
            await wait_until(
                lambda: (
                    [json.loads(p) for p in on_new if '"visibility"' in str(p)]
                    == [{"type": "visibility", "visible": True}]
                ),
                timeout=10,
            )
            assert said() == [True, False, True, False, True, True]
        finally:
            await chat.close()


async def test_a_hidden_tab_notifies_of_a_direct_message_or_mention_and_a_visible_one_does_not(
    browser: Browser, tmp_path: Path
) -> None:
    """With notifications allowed and enabled, ada's page shows nothing while she looks at it
    (carol's direct message); hidden, bob's mention in the lobby and his direct message each
    show one (through the service worker's registration: conversation and author, the text,
    one tag per conversation, a link to the message), his plain message in the lobby none,
    nor her own. The link opens the conversation at the message."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await notifying_page(browser, live.http_url, "ada", "lobby")
        try:
            await ada.say("hello")
            await ada.shows(["hello"])
            await wait_stored(store_of(live), "lobby", 1, timeout=10)
            async with (
                ChatClient.connect(live.ws_url("bob")) as bob,
                ChatClient.connect(live.ws_url("carol")) as carol,
                ChatClient.connect(live.ws_url("ada")) as ada_elsewhere,
            ):
                for client in (bob, carol, ada_elsewhere):
                    await client.expect("inbox")  # sent after hello, with a store
                await carol.say_to("ada", "while you look")
                await expect(ada.page.locator("#dms li[data-room='@carol']")).to_have_count(1)
                await set_visibility(ada, "hidden")
                for client in (bob, ada_elsewhere):
                    await answer(client, {"type": "join", "room": "lobby"}, "joined")
                await bob.say("lobby", "@ada the plan")
                await ada.shows(["hello", "@ada the plan"])
                await ada_elsewhere.say("lobby", "@here from my phone")  # hers: none
                await bob.say("lobby", "nothing for ada")  # her level of rooms: mentions
                await bob.say_to("ada", "psst")
                await ada.shows(
                    ["hello", "@ada the plan", "@here from my phone", "nothing for ada"]
                )
                # Every message reached the page (a notification is asked for as one comes).
                await page_holds(ada, "hubbub.rooms.get('@bob')?.messages.size === 1")
                shown = await notifications_until(ada, 2)
            highlighted = ada.page.locator("#messages .message.mentioned .text")
            await expect(highlighted).to_have_text(["@ada the plan"])  # her own @here: not
            by_tag = {notification["tag"]: notification for notification in shown}
            assert sorted(by_tag) == ["hubbub:room:lobby", "hubbub:with:bob"], shown
            mention, direct = by_tag["hubbub:room:lobby"], by_tag["hubbub:with:bob"]
            assert (mention["title"], mention["body"]) == ("lobby · bob", "@ada the plan")
            assert (direct["title"], direct["body"]) == ("bob · direct message", "psst")
            psst = direct["data"]["id"]
            assert direct["data"]["url"] == f"{live.http_url}/?with=bob&message={psst}"
            assert mention["data"]["room"] == "lobby"
            await ada.page.goto(direct["data"]["url"])  # as a click opens it, with no tab left
            await ada.connected()
            await expect(ada.page.locator("#room-title")).to_have_text("@bob")
            await expect(ada.page.locator("#messages .message.found .text")).to_have_text("psst")
        finally:
            await ada.close()


async def test_the_service_worker_is_served_for_the_page_and_registered(
    browser: Browser, server: LiveServer
) -> None:
    """/static/sw.js is JavaScript allowed the page's scope ("/"), never cached stale; the
    page's policy allows it as a worker; once notifications are enabled it controls the
    page, scope "/", and shows a push from its payload when no tab of the chat is open.
    Without a push service (headless Chromium) the page says nothing alarming."""
    async with httpx.AsyncClient() as http:
        got = await http.get(f"{server.http_url}/static/sw.js")
        page = await http.get(f"{server.http_url}/")
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("text/javascript")
    assert got.headers["service-worker-allowed"] == "/"
    assert got.headers["cache-control"] == "no-cache"
    assert got.headers["x-content-type-options"] == "nosniff"
    assert 'addEventListener("push"' in got.text
    assert "worker-src 'self'" in page.headers["content-security-policy"]

    chat = await notifying_page(browser, server.http_url, "ada", "lobby")
    try:
        registration = await chat.page.evaluate(
            """async () => {
              const registration = await navigator.serviceWorker.getRegistration("/");
              return { scope: registration.scope, script: registration.active.scriptURL };
            }"""
        )
        assert registration == {
            "scope": f"{server.http_url}/",
            "script": f"{server.http_url}/static/sw.js",
        }
        await expect(chat.page.locator("#alerts .alert")).to_have_count(0)
        assert frames_sent(chat, "push_subscribe") == []  # the server offers no push key

        # A push, as a push service delivers it (CDP), once no tab of the chat is open: shown
        # from its payload, tagged by conversation, linking to the message. Another page of
        # the origin (not the chat) reads what its registration shows.
        context = chat.page.context
        other = await context.new_page()
        await other.goto(f"{server.http_url}/static/chat.css")
        cdp = await context.new_cdp_session(other)
        registrations: list[str] = []
        cdp.on(
            "ServiceWorker.workerRegistrationUpdated",
            lambda event: registrations.extend(
                found["registrationId"]
                for found in event["registrations"]
                if found["scopeURL"] == f"{server.http_url}/" and not found["isDeleted"]
            ),
        )
        await cdp.send("ServiceWorker.enable")
        await wait_until(lambda: bool(registrations), timeout=10)
        await chat.page.close()
        push = {
            "origin": server.http_url,
            "registrationId": registrations[0],
            "data": json.dumps(
                {"type": "notification", "with": "carol", "id": 9, "text": "psst",
                 "user": "bob-0123456789abcdef", "ts": 1_700_000_000_000,
                 "reason": "direct", "count": 3}
            ),
        }  # fmt: skip
        # Chromium's getNotifications() forgets a notification still being shown when it runs
        # (see COUNT_SHOWN), and this page cannot see the worker's calls finish: the push is
        # delivered again (the same tag: it replaces the first) if a read came too early.
        shown: list[Frame] = []
        async with asyncio.timeout(15):
            while not shown:
                await cdp.send("ServiceWorker.deliverPushMessage", push)
                for _ in range(10):
                    await asyncio.sleep(0.3)  # reads apart: each may forget one in flight
                    shown = await other.evaluate(
                        """async () => {
                          const registration = await navigator.serviceWorker.getRegistration("/");
                          return (await registration.getNotifications()).map(
                            (n) => ({ title: n.title, body: n.body, tag: n.tag, data: n.data }));
                        }"""
                    )
                    if shown:
                        break
        assert shown == [
            {
                "title": "bob · direct message (3 new)",
                "body": "psst",
                "tag": "hubbub:with:carol",
                "data": {
                    "with": "carol",
                    "id": 9,
                    "url": f"{server.http_url}/?with=carol&message=9",
                },
            }
        ]
    finally:
        await chat.close()


async def test_the_level_control_sends_notifications_and_shows_the_servers_answer(
    browser: Browser, tmp_path: Path
) -> None:
    """The header's control asks the conversation's level when opened and shows what the
    server answers (a level set from elsewhere included); a level or a mute picked is sent as
    a `notifications` frame and shown once answered; a reload shows it again."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        chat = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        try:
            button = chat.page.locator("#notify-button")
            label_ = chat.page.locator("#notify-label")
            await expect(button).to_be_visible()
            await expect(label_).to_have_text("Mentions & DMs")  # a room's default
            async with ChatClient.connect(live.ws_url("ada")) as elsewhere:
                await answer(
                    elsewhere,
                    {"type": "notifications", "room": "lobby", "level": "all"},
                    "notifications",
                )
            await button.click()
            await expect(button).to_have_attribute("aria-expanded", "true")
            assert frames_sent(chat, "notifications")[-1] == {
                "type": "notifications",
                "room": "lobby",
            }
            await expect(label_).to_have_text("All messages")  # the server's answer
            await expect(chat.page.get_by_label("All messages")).to_be_checked()

            await chat.page.get_by_label("Nothing").check()
            await expect(label_).to_have_text("Nothing")
            assert frames_sent(chat, "notifications")[-1] == {
                "type": "notifications",
                "room": "lobby",
                "level": "none",
            }
            before = await chat.page.evaluate("Date.now()")
            await chat.page.get_by_role("button", name="Mute for 1 hour").click()
            # A time today ("Muted until 14:05"), or with the day when the hour ends after
            # midnight ("Muted until Sat 00:05"): the page says which.
            await expect(label_).to_have_text(re.compile(r"^Muted until (\w+,? )?\d"))
            until = frames_sent(chat, "notifications")[-1]["mute_until"]
            assert isinstance(until, int) and 0 <= until - before - 3_600_000 < 60_000
            await chat.page.get_by_role("button", name="Unmute").click()
            await expect(label_).to_have_text("Nothing")
            assert frames_sent(chat, "notifications")[-1]["mute_until"] == 0
            await chat.page.keyboard.press("Escape")
            await expect(chat.page.locator("#notify-panel")).to_be_hidden()
            await expect(button).to_be_focused()

            await chat.page.reload()
            await chat.connected()
            await expect(label_).to_have_text("Nothing")  # the levels you changed, listed
        finally:
            await chat.close()


# Chromium's own console message when a page subscribes to push where it has no push service
# (a headless or incognito window): the browser's, not the page's.
NO_PUSH_SERVICE = "Chrome currently does not support the Push API in incognito mode"


async def test_without_a_push_service_the_page_keeps_its_own_notifications_quietly(
    browser: Browser, tmp_path: Path
) -> None:
    """A server with Web Push offers its key in hello; the page, notifications enabled, tries
    to subscribe with it. Headless Chromium has no push service: the page tells the server
    nothing, shows no alert, and still says notifications come while the tab is hidden, as
    they do."""
    private, public = generate_keys()
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/data/hubbub.db", vapid_private_key=private
    )
    async with run_server(settings) as live:
        ada = await notifying_page(browser, live.http_url, "ada", "lobby")
        try:
            assert await ada.page.evaluate("hubbub.client.hello.push_key") == public
            # The subscription was tried (and refused by the browser).
            await wait_until(lambda: any(NO_PUSH_SERVICE in e for e in ada.errors), timeout=10)
            ada.errors[:] = [error for error in ada.errors if NO_PUSH_SERVICE not in error]
            await expect(ada.page.locator("#notify-state")).to_have_text(
                "Notifications are on: mentions and direct messages while this tab is in the "
                "background."
            )
            await expect(ada.page.locator("#alerts .alert")).to_have_count(0)
            assert frames_sent(ada, "push_subscribe") == []
            await set_visibility(ada, "hidden")
            async with ChatClient.connect(live.ws_url("bob")) as bob:
                await bob.say_to("ada", "still told")
                [shown] = await notifications_until(ada, 1)
            assert (shown["title"], shown["body"]) == ("bob · direct message", "still told")
        finally:
            await ada.close()


async def test_a_muted_persons_messages_are_hidden_and_come_back_on_unmute(
    browser: Browser, tmp_path: Path
) -> None:
    """Ada mutes bob from his message's actions: his messages shown already collapse to
    "Hidden: muted user" (no text, no name), the server sends her none of his new ones, and
    "Muted and blocked" lists him; Unmute there shows his messages again, the one sent while
    he was muted included. Her page sent exactly `mute` and `unmute`."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        try:
            async with ChatClient.connect(live.ws_url("bob")) as bob:
                await bob.join("lobby")
                await bob.say("lobby", "one")
                await bob.say("lobby", "two")
                await ada.shows(["one", "two"])
                hidden_list = ada.page.locator("#hidden-people")
                await expect(ada.page.locator("#hidden-none")).to_be_visible()
                first = ada.page.locator("#messages .message").first
                await first.hover()  # its actions show
                await first.get_by_role("button", name="Mute bob").click()
                collapsed = ada.page.locator("#messages .hidden-message")
                await expect(collapsed).to_have_text([re.compile(r"Hidden: muted user$")] * 2)
                await expect(ada.page.locator("#messages .message .text")).to_have_count(0)
                await expect(ada.page.locator("#messages .author")).to_have_count(0)
                await expect(ada.page.locator("#alerts .alert.info")).to_contain_text(
                    "bob is muted"
                )
                await expect(hidden_list.locator("li")).to_have_text(
                    [re.compile(r"bob\s*\(muted\)")]
                )
                await expect(ada.page.locator("#hidden-none")).to_be_hidden()

                await bob.say("lobby", "while muted")
                await ada.say("mine")
                await ada.shows(["mine"])  # bob's new message never came
                await expect(collapsed).to_have_count(2)

                await hidden_list.get_by_role("button", name="Unmute bob").click()
                await ada.shows(["one", "two", "while muted", "mine"])
                await expect(collapsed).to_have_count(0)
                await expect(hidden_list.locator("li")).to_have_count(0)
                await expect(ada.page.locator("#hidden-none")).to_be_focused()  # not lost
            assert frames_sent(ada, "mute") == [{"type": "mute", "user": "bob"}]
            assert frames_sent(ada, "unmute") == [{"type": "unmute", "user": "bob"}]
        finally:
            await ada.close()


async def test_a_direct_conversation_blocks_and_unblocks_its_person(
    browser: Browser, tmp_path: Path
) -> None:
    """In the direct conversation with bob, Block hides his messages and keeps him from
    writing to ada (the server refuses him); the header then offers Unblock only, which
    undoes it. A change made in another tab of ada's reaches this one by itself."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        try:
            async with ChatClient.connect(live.ws_url("bob")) as bob:
                await bob.say_to("ada", "hi ada")
                await ada.page.locator("#dms li .room").click()
                await ada.shows(["hi ada"])
                head = ada.page.locator(".room-head")
                await head.get_by_role("button", name="Block bob").click()
                await expect(ada.page.locator("#messages .hidden-message")).to_have_text(
                    re.compile(r"Hidden: blocked user$")
                )
                await expect(head.get_by_role("button", name="Unblock bob")).to_be_visible()
                await expect(head.get_by_role("button", name="Mute bob")).to_be_hidden()
                refused = await answer(bob, {"type": "send", "to": "ada", "text": "no"}, "error")
                assert refused["code"] == "forbidden"
                await head.get_by_role("button", name="Unblock bob").click()
                await ada.shows(["hi ada"])
                await expect(head.get_by_role("button", name="Mute bob")).to_be_visible()
                # Another tab of ada's mutes bob: this page hears of it and collapses him.
                async with ChatClient.connect(live.ws_url("ada")) as tab:
                    await answer(tab, {"type": "mute", "user": "bob"}, "hidden")
                await expect(ada.page.locator("#messages .hidden-message")).to_have_count(1)
                await expect(head.get_by_role("button", name="Unmute bob")).to_be_visible()
        finally:
            await ada.close()


SERVICE_TOKEN = "a-service-token-of-at-least-32-characters"


async def test_a_report_asks_why_and_reaches_the_moderators_queue(
    browser: Browser, tmp_path: Path
) -> None:
    """Report on bob's message (ada is no moderator: no queue for her) opens a dialog that
    asks why (the focus in its text box); Send report closes it, says so, and gives the
    focus back; the backend's queue holds the report (reporter, reason, the message as it
    was). A report of a message deleted meanwhile stays in the dialog with the reason it was
    not sent; Cancel closes it."""
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/data/hubbub.db", service_token=SERVICE_TOKEN
    )
    service = {"Authorization": f"Bearer {SERVICE_TOKEN}"}
    async with (
        run_server(settings) as live,
        httpx.AsyncClient(base_url=live.http_url, headers=service) as http,
    ):
        ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
        try:
            async with ChatClient.connect(live.ws_url("bob")) as bob:
                await bob.join("lobby")
                await bob.say("lobby", "something rude")
                await bob.say("lobby", "more of it")
                await ada.shows(["something rude", "more of it"])
                # Not a moderator (the server refused her `reports`): no queue, no Delete.
                await wait_until(lambda: len(frames_sent(ada, "reports")) == 1)
                await expect(ada.page.locator("#reports-entry")).to_be_hidden()
                moderate = ada.page.get_by_role("button", name="Delete as a moderator")
                await expect(moderate).to_have_count(0)
                dialog = ada.page.locator("#report-dialog")
                rude = ada.page.locator("#messages .message").first
                opener = rude.get_by_role("button", name="Report this message")
                await rude.hover()
                await opener.click()
                await expect(dialog).to_be_visible()
                await expect(dialog.locator("#report-quote")).to_have_text("bob: something rude")
                await expect(ada.page.locator("#report-reason")).to_be_focused()
                await ada.page.keyboard.type("insulting")
                await dialog.get_by_role("button", name="Send report").click()
                await expect(dialog).to_be_hidden()
                await expect(ada.page.locator("#alerts .alert.info")).to_contain_text("Report sent")
                await expect(opener).to_be_focused()
                queue = (await http.get("/api/v1/reports")).json()["reports"]
                got = [(r["reporter"], r["reason"], r["room"], r["message"]["text"]) for r in queue]
                assert got == [("ada", "insulting", "lobby", "something rude")]

                # Deleted while ada says why: not sent, and she is told.
                second = ada.page.locator("#messages .message").nth(1)
                second_id = int(await second.get_attribute("data-id") or 0)
                # From the keyboard this time (the focus is on the first one's Report).
                await second.get_by_role("button", name="Report this message").focus()
                await ada.page.keyboard.press("Enter")
                await expect(dialog).to_be_visible()
                await ada.page.locator("#report-reason").fill("spam")
                await answer(bob, {"type": "delete", "room": "lobby", "id": second_id}, "deleted")
                await dialog.get_by_role("button", name="Send report").click()
                await expect(dialog.locator("#report-state")).to_have_text(
                    "Not sent: the message is gone, or you cannot read it any more."
                )
                await dialog.get_by_role("button", name="Cancel").click()
                await expect(dialog).to_be_hidden()
            assert [f["reason"] for f in frames_sent(ada, "report")] == ["insulting", "spam"]
            assert len((await http.get("/api/v1/reports")).json()["reports"]) == 1
        finally:
            await ada.close()


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (30, 120, 200)).save(out, "PNG")
    return out.getvalue()


class TeaSite:
    """A site on loopback with one page that has Open Graph tags (markup in its title) and
    their image."""

    PAGE = (
        b"<html><head><title>Fallback</title>"
        b'<meta property="og:title" content="Tea &amp; &lt;b&gt;cakes&lt;/b&gt;">'
        b'<meta property="og:description" content="Where to have tea.">'
        b'<meta property="og:site_name" content="Teatime">'
        b'<meta property="og:image" content="/tea.png"></head><body>tea</body></html>'
    )

    def __init__(self) -> None:
        self.port = free_port()
        self.image = _png(400, 200)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        found = {"/article": (b"text/html; charset=utf-8", self.PAGE),
                 "/tea.png": (b"image/png", self.image)}.get(scope["path"])  # fmt: skip
        status, (kind, body) = (200, found) if found else (404, (b"text/plain", b""))
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind)]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})


async def test_a_links_preview_is_a_card_under_its_message(
    browser: Browser, tmp_path: Path
) -> None:
    """A message's first link gets a card: the site, the title (as text: its markup is not
    markup) linking to the page, the description, and the image from this server's file
    storage, really loaded under the page's CSP. Only the first link is asked about; a link
    that cannot be previewed (a loopback address) shows nothing."""
    site = TeaSite()
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/data/hubbub.db",
        preview_test_public_addresses=[f"127.0.0.1:{site.port}"],
    )
    async with serving(site, site.port, log_level="warning", lifespan="off"):
        async with run_server(settings) as live:
            ada = await ChatPage.open(browser, live.http_url, "ada", "lobby")
            try:
                article = site.url("/article")
                await ada.say(f"look {article} and {site.url('/other')}")
                await ada.say("nothing at http://127.0.0.1:9/page")
                card = ada.page.locator("#messages .message").first.locator(".link-preview")
                await expect(card).to_be_visible(timeout=UI_TIMEOUT_MS)
                await expect(card.locator(".preview-site")).to_have_text("Teatime")
                title = card.locator(".preview-title")
                await expect(title).to_have_text("Tea & <b>cakes</b>")
                await expect(title).to_have_attribute("href", article)
                await expect(card.locator("b")).to_have_count(0)
                await expect(card.locator(".preview-description")).to_have_text(
                    "Where to have tea."
                )
                await expect(card).to_have_attribute("aria-label", "Link preview: Teatime")
                image = card.locator("img.preview-image")
                src = await image.get_attribute("src") or ""
                assert src.startswith(f"{live.http_url}/files/"), src  # never the site's
                await expect(image).to_have_attribute("width", "96")  # fits its box
                await ada.page.wait_for_function(
                    "document.querySelector('.link-preview img').naturalWidth > 0",
                    timeout=UI_TIMEOUT_MS,
                )
                await wait_until(lambda: len(frames_sent(ada, "preview")) == 2)
                await ada.page.wait_for_timeout(500)  # the refusal came back: still no card
                second = ada.page.locator("#messages .message").nth(1)
                await expect(second.locator(".preview-slot")).to_be_empty()
                assert frames_sent(ada, "preview") == [
                    {"type": "preview", "url": article},
                    {"type": "preview", "url": "http://127.0.0.1:9/page"},
                ]
                # Shown again (another conversation, and back): from the page's cache.
                await ada.page.locator("#join-input").fill("side")
                await ada.page.locator("#join-input").press("Enter")
                await expect(ada.page.locator("#room-title")).to_have_text("side")
                await ada.page.locator("#rooms li", has_text="lobby").locator(".room").click()
                await expect(card.locator(".preview-title")).to_have_text("Tea & <b>cakes</b>")
                assert len(frames_sent(ada, "preview")) == 2
            finally:
                await ada.close()


async def moderator_page(browser: Browser, live: LiveServer, user: str) -> ChatPage:
    """The page of moderator ``user`` on a ``jwt`` server. The page itself signs in by name
    only (the server refuses that, and the page stays closed); this hands its client a token
    with the moderator role, as a sign-in would, and connects it again."""
    context = await browser.new_context(viewport={"width": 1200, "height": 800})
    chat = ChatPage(await context.new_page())
    await chat.page.goto(f"{live.http_url}/?name={user}&room=lobby")
    await expect(chat.page.locator("#status")).to_have_attribute("data-state", "closed")
    await chat.page.evaluate(
        "token => { hubbub.client.getToken = async () => token; hubbub.client.connect(); }",
        token(user, roles=["moderator"]),
    )
    await chat.connected()
    return chat


async def test_a_moderator_works_the_reports_queue_from_the_page(
    browser: Browser, tmp_path: Path
) -> None:
    """A moderator's page (the server answers its `reports` request) has "Reports to
    moderate" with the open count, and Delete on everyone's messages. The queue lists each
    report (where, who reported it, the message, the reason) with Dismiss, Delete message,
    Kick and Ban: Delete message deletes it for everyone and the report leaves the list;
    Kick disconnects its author; Ban keeps them out for the time picked."""
    settings = jwt_settings(tmp_path)
    async with run_server(settings) as live:
        url = live.ws_url()
        async with (
            ChatClient.connect(f"{url}?token={token('troll')}") as troll,
            ChatClient.connect(f"{url}?token={token('ada')}") as ada,
        ):
            await answer(troll, {"type": "join", "room": "lobby"}, "joined")
            say = {"type": "send", "room": "lobby", "text": "buy cheap stuff"}
            rude = await answer(troll, say, "message")
            report = {"type": "report", "room": "lobby", "id": rude["id"], "reason": "spam"}
            await answer(ada, report, "reported")
            await answer(ada, {"type": "join", "room": "lobby"}, "joined")
            mod = await moderator_page(browser, live, "mod")
            try:
                await mod.shows(["buy cheap stuff"])
                entry = mod.page.get_by_role("button", name="Reports to moderate")
                await expect(entry).to_be_visible()
                await expect(mod.page.locator("#reports-count")).to_have_text("1 open")
                message = mod.page.locator("#messages .message").first
                await message.hover()
                await expect(
                    message.get_by_role("button", name="Delete as a moderator")
                ).to_be_visible()
                await entry.click()
                await expect(entry).to_have_attribute("aria-expanded", "true")
                item = mod.page.locator("#reports-list li")
                await expect(item).to_have_count(1)
                await expect(item.locator(".result-head")).to_contain_text(
                    "lobby · reported by ada"
                )
                await expect(item.locator(".report-message")).to_have_text("troll: buy cheap stuff")
                await expect(item.locator(".report-reason")).to_have_text("Reason: spam")
                await expect(mod.page.locator("#reports-summary")).to_have_text("1 open report")

                await item.get_by_role("button", name="Delete message of report").click()
                await expect(item).to_have_count(0)
                await expect(mod.page.locator("#reports-summary")).to_have_text("No open reports")
                await expect(mod.page.locator("#messages .message .text")).to_have_text(
                    "Message deleted"
                )
                deleted = await ada.expect("deleted")
                assert (deleted["target"], deleted["user"]) == (rude["id"], "mod")
                await expect(mod.page.locator("#reports-count")).to_be_hidden()

                # Kick and Ban, from a report of troll's next message.
                again = await answer(troll, say | {"text": "again"}, "message")
                report["id"] = again["id"]
                await answer(ada, report, "reported")
                await mod.page.get_by_role("button", name="Refresh").click()
                await expect(item).to_have_count(1)
                await item.get_by_role("button", name="Kick troll").click()
                assert await troll.closed_with() == 4003
                await expect(mod.page.locator("#alerts .alert.info").last).to_have_text(
                    re.compile("troll was disconnected")
                )
                await item.get_by_label("How long to ban troll").select_option(label="1 hour")
                await item.get_by_role("button", name="Ban troll").click()
                await expect(mod.page.locator("#alerts .alert.info").last).to_have_text(
                    re.compile("troll is banned for 1 hour")
                )
                assert frames_sent(mod, "ban")[-1] == {
                    "type": "ban", "user": "troll", "duration_s": 3600,
                }  # fmt: skip
                await item.get_by_role("button", name="Dismiss report").click()
                await expect(item).to_have_count(0)
            finally:
                await mod.close()
