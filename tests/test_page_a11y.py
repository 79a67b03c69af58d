"""The chat page passes an accessibility audit (axe-core, WCAG 2.0/2.1 A and AA) with no
serious or critical violation — colour contrast included — on a desktop, on a phone and in
dark mode, with two people chatting (replies, reactions, "seen by", a "New messages" line,
typing, an alert, an invitation, a picture and a file, a file waiting to be sent). On a
phone the rooms are an off-canvas drawer and the composer is always on screen. Screenshots
are saved in test-artifacts/; axe's full results beside them (``axe-<view>.json``)."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from playwright.async_api import Browser, FilePayload, Page, expect

from tests.helpers import make_settings, run_server
from tests.processes import ROOT
from tests.test_browser import ARTIFACTS, UI_TIMEOUT_MS, ChatPage, browser

__all__ = ["browser"]  # the fixture, shared with tests/test_browser.py

# axe-core, pinned in tests/a11y/package-lock.json (`make node-deps` installs it).
AXE = ROOT / "tests" / "a11y" / "node_modules" / "axe-core" / "axe.min.js"
WCAG_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
BLOCKING = {"serious", "critical"}


@dataclass(frozen=True)
class View:
    name: str
    width: int
    height: int
    dark: bool = False

    @property
    def screenshot(self) -> Path:
        return ARTIFACTS / ("chat-dark.png" if self.dark else f"chat-{self.name}-a11y.png")


VIEWS = [
    View("desktop", 1200, 800),
    View("phone", 390, 844),
    View("dark", 1200, 800, dark=True),
]


async def open_view(browser: Browser, base_url: str, name: str, room: str, view: View) -> ChatPage:
    # The page's Content-Security-Policy (app/web/page.py: script-src 'self') refuses the
    # inline <script> that add_script_tag(path=...) makes of axe-core: this context bypasses
    # the CSP, for the audit only (tests/test_browser.py checks the page under its CSP).
    context = await browser.new_context(
        viewport={"width": view.width, "height": view.height},
        color_scheme="dark" if view.dark else "light",
        is_mobile=view.name == "phone",
        has_touch=view.name == "phone",
        bypass_csp=True,
    )
    chat = ChatPage(await context.new_page())
    await chat.page.goto(f"{base_url}/?name={name}&room={room}")
    await chat.connected()
    await expect(chat.page.locator("#room-title")).to_have_text(room)
    return chat


async def audit(page: Page, context: str = "document") -> dict[str, Any]:
    """axe-core's results for ``context`` (a CSS selector, or the whole document)."""
    if not await page.evaluate("typeof window.axe === 'object'"):
        if not AXE.is_file():
            pytest.fail(f"{AXE} is missing: run `make node-deps` (npm ci in tests/a11y)")
        await page.add_script_tag(path=AXE)
    target = (
        "document" if context == "document" else f"document.querySelector({json.dumps(context)})"
    )
    results: dict[str, Any] = await page.evaluate(
        f"axe.run({target}, {{runOnly: {{type: 'tag', values: {json.dumps(WCAG_AA)}}}}})"
    )
    return results


def blocking(results: dict[str, Any]) -> list[str]:
    """The serious and critical violations, one line per element: rule, target, summary."""
    lines = []
    for violation in results["violations"]:
        for node in violation["nodes"]:
            if (node.get("impact") or violation["impact"]) in BLOCKING:
                summary = " ".join(node.get("failureSummary", "").split())
                lines.append(f"{violation['id']} {node['target']}: {summary}")
    return lines


def others(results: dict[str, Any]) -> list[str]:
    """The moderate and minor violations (reported, not failed on)."""
    return [
        f"{violation['id']} ({violation['impact']}) x{len(violation['nodes'])}"
        for violation in results["violations"]
        if violation["impact"] not in BLOCKING
    ]


def file(name: str, mime: str, data: bytes) -> FilePayload:
    return {"name": name, "mimeType": mime, "buffer": data}


def picture() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (640, 400), (40, 110, 170)).save(out, "PNG")
    return out.getvalue()


async def chat_in_the_lobby(viewer: ChatPage, bob: ChatPage) -> None:
    """Ada (``viewer``) and bob chat: a reply with a quote, a long message, formatting,
    reactions (one hers), "seen by", a "New messages" line, bob typing, an alert, an
    invitation, bob's picture and PDF, and a file of ada's waiting above her composer."""
    ada = viewer
    await ada.say("hello bob, have you seen the plans for the **new office**?")
    await expect(bob.page.locator("#messages .message .text")).to_have_count(1)
    first = bob.page.locator("#messages .message").first
    await first.hover()
    await first.get_by_role("button", name="Reply").click()
    long = (
        "Yes! I read them all this morning and I think the kitchen is far too small for "
        "twenty people, the meeting rooms have no windows, and nobody has thought about "
        "where the bicycles go. Can we talk about it before Friday? " * 2
    ).strip()
    await bob.say(long)
    await bob.say(
        "> nobody has thought about where the bicycles go\nthe yard: see "
        "https://example.com/plans and run `make check`, or:\n```\nmake run\n```"
    )
    texts = bob.page.locator("#messages .message .text")
    await expect(texts).to_have_count(3, timeout=UI_TIMEOUT_MS)
    await expect(ada.page.locator("#messages .message .text")).to_have_count(3)
    # Reactions: bob's 👍 on ada's message, and ada's on the same chip (pressed).
    first = bob.page.locator("#messages .message").first
    await first.hover()
    await first.get_by_role("button", name="React 👍").click()
    chip = ada.page.locator("#messages .message").first.locator(".reaction")
    await expect(chip).to_have_text("👍 1", timeout=UI_TIMEOUT_MS)
    await chip.click()
    await expect(chip).to_have_attribute("aria-pressed", "true")

    # Ada is in another room while bob writes two more: back in the lobby, "New messages".
    await ada.page.evaluate("document.body.classList.add('drawer-open')")  # the phone's drawer
    await ada.page.locator("#join-input").fill("side")
    await ada.page.locator("#join-input").press("Enter")
    await expect(ada.page.locator("#room-title")).to_have_text("side")
    await bob.say("are you still there?")
    await bob.say("ok, talk later")
    lobby = ada.page.locator('#rooms li[data-room="lobby"]')
    await expect(lobby.locator(".unread")).to_have_text("2", timeout=UI_TIMEOUT_MS)
    await ada.page.evaluate("document.body.classList.add('drawer-open')")
    await lobby.locator(".room").click()
    await expect(ada.page.locator("#room-title")).to_have_text("lobby")
    await ada.page.evaluate("document.body.classList.remove('drawer-open')")
    await expect(ada.page.locator("#messages .new-divider")).to_have_count(1)
    await ada.say("sure, Friday it is")
    await expect(ada.page.locator("#messages .message .seen").last).to_have_text(
        "Seen by bob", timeout=UI_TIMEOUT_MS
    )

    await bob.page.locator("#composer-input").press_sequentially("typ")
    await expect(ada.page.locator("#typing")).to_have_text("bob is typing…")
    # A refused frame (an error alert), and an invitation waiting for Join or Decline.
    await ada.page.evaluate("hubbub.client.leave('nowhere')")
    await expect(ada.page.locator("#alerts .alert")).to_contain_text("not_joined")
    await ada.page.evaluate(
        """() => hubbub.client.dispatchEvent(new CustomEvent("invited", {detail: {
            type: "invited", room: "plans", private: true, title: "", topic: "",
            role: "member", by: "bob"}}))"""
    )
    await expect(ada.page.locator("#invitations .invitation")).to_contain_text("plans")

    await bob.page.locator("#file-input").set_input_files([
        file("office.png", "image/png", picture()),
        file("floor plan.pdf", "application/pdf", b"%PDF-1.4\n" + bytes(4000)),
    ])  # fmt: skip
    await expect(bob.page.locator("#uploads .upload.done")).to_have_count(2, timeout=UI_TIMEOUT_MS)
    await bob.page.locator("#send-button").click()
    shown = ada.page.locator("#messages .message").last
    await expect(shown.locator(".attachment-file")).to_have_count(1, timeout=UI_TIMEOUT_MS)
    # Links are asked for once a file is on screen (near it): the view may rest higher up.
    await shown.scroll_into_view_if_needed()
    await expect(shown.locator(".file-download[href]")).to_have_count(1, timeout=UI_TIMEOUT_MS)
    await ada.page.wait_for_function(
        "img => img.complete && img.naturalWidth > 0",
        arg=await shown.locator(".attachment-image img").element_handle(),
        timeout=UI_TIMEOUT_MS,
    )
    await ada.page.locator("#file-input").set_input_files(
        file("notes.txt", "text/plain", b"for friday")
    )
    await expect(ada.page.locator("#uploads .upload.done")).to_have_count(1, timeout=UI_TIMEOUT_MS)


async def action_bars_are_keyboard_reachable_and_cover_nothing(page: Page) -> None:
    """Tab from a reaction chip reaches its message's action bar, which shows (:focus-within)
    on its own: it covers none of a long message's parts (quote, time, author, text)."""
    first = page.locator("#messages .message").first
    await first.locator(".reaction").focus()
    await page.keyboard.press("Tab")
    focused = first.locator(".actions .action:focus")
    await expect(focused).to_have_count(1)
    await expect(focused).to_be_in_viewport()
    await expect(first.locator(".actions")).to_be_visible()
    long = page.locator("#messages .message").nth(1)  # bob's long reply, with its quote
    await long.locator(".actions .action").first.focus()
    overlaps = await long.evaluate(
        """item => {
            const bar = item.querySelector(".actions").getBoundingClientRect();
            return [...item.querySelectorAll(".quote, .meta, .author, .text")].filter(part => {
                const box = part.getBoundingClientRect();
                return box.left < bar.right && bar.left < box.right
                    && box.top < bar.bottom && bar.top < box.bottom;
            }).map(part => part.className);
        }"""
    )
    assert overlaps == [], f"the action bar covers {overlaps}"
    # Shown for the screenshots: the newest message's bar, the list at its end.
    await page.locator("#messages .message").last.locator(".actions .action").first.focus()
    await page.locator("#messages").evaluate("list => { list.scrollTop = list.scrollHeight }")


async def placeholders_cut(page: Page) -> list[str]:
    """The shown inputs whose placeholder is wider than their text box."""
    cut: list[str] = await page.evaluate(
        """() => {
            const measure = document.createElement("canvas").getContext("2d");
            return [...document.querySelectorAll("input[placeholder], textarea[placeholder]")]
                .filter(input => input.checkVisibility({visibilityProperty: true}))
                .map(input => {
                    const style = getComputedStyle(input);
                    measure.font = style.font;
                    const room = input.clientWidth - parseFloat(style.paddingLeft)
                        - parseFloat(style.paddingRight);
                    const need = measure.measureText(input.placeholder).width;
                    return need > room ? `#${input.id}: ${need | 0}px in ${room | 0}px` : "";
                }).filter(Boolean);
        }"""
    )
    return cut


@pytest.mark.parametrize("view", VIEWS, ids=[view.name for view in VIEWS])
async def test_page_has_no_serious_accessibility_violation(
    browser: Browser, tmp_path: Path, view: View
) -> None:
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/hubbub.db")
    async with run_server(settings) as live:
        ada = await open_view(browser, live.http_url, "ada", "lobby", view)
        bob = await ChatPage.open(browser, live.http_url, "bob", "lobby")
        try:
            await chat_in_the_lobby(ada, bob)
            page = ada.page
            await action_bars_are_keyboard_reachable_and_cover_nothing(page)
            # The whole composer on screen, however long the conversation.
            await expect(page.locator("#composer")).to_be_in_viewport(ratio=1)
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=view.screenshot, animations="disabled")
            assert view.screenshot.stat().st_size > 10_000

            results = [await audit(page)]
            if view.name == "phone":
                await phone_layout(page)
                results.append(await audit(page))  # the drawer open
            cut = await placeholders_cut(page)
            assert not cut, f"placeholders cut: {cut}"
            # The composer's counter over the limit (the error colour).
            limit = await page.evaluate("hubbub.client.hello.limits.max_text_chars")
            await page.locator("#composer-input").fill("x" * (limit + 1))
            await expect(page.locator("#counter.over")).to_have_text(f"{limit + 1}/{limit}")
            results.append(await audit(page, "#composer"))
            if view.dark:  # really dark: the page, the sidebar, the fields
                for part in ("html", "#sidebar", "#composer-input"):
                    color = await page.locator(part).evaluate(
                        "node => getComputedStyle(node).backgroundColor"
                    )
                    channels = [int(c) for c in color[color.index("(") + 1 : -1].split(",")[:3]]
                    assert max(channels) < 64, f"{part} is not dark in dark mode: {color}"

            (ARTIFACTS / f"axe-{view.name}.json").write_text(
                json.dumps([r["violations"] for r in results], indent=1)
            )
            failures = [line for result in results for line in blocking(result)]
            minor = sorted({line for result in results for line in others(result)})
            assert not failures, (
                f"axe-core found serious or critical WCAG 2.1 AA violations ({view.name}):\n"
                + "\n".join(failures)
                + (f"\n(also, not failed on: {', '.join(minor)})" if minor else "")
            )
            print(f"{view.name}: no serious violation; moderate or minor: {minor or 'none'}")
        finally:
            await ada.close()
            await bob.close()


async def phone_layout(page: Page) -> None:
    """At phone width: no horizontal scrolling, the composer on screen, the rooms an
    off-canvas drawer that body.drawer-open (the Rooms button's class) shows."""
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page is {overflow}px wider than a phone"
    await expect(page.locator("#composer-input")).to_be_in_viewport()
    await expect(page.locator("#send-button")).to_be_in_viewport()
    await expect(page.locator("#drawer-toggle")).to_be_visible()
    await expect(page.locator("#sidebar")).not_to_be_in_viewport()
    # The message list takes the height left: the composer ends at the bottom of the screen.
    bottom = await page.evaluate(
        "document.getElementById('composer').getBoundingClientRect().bottom"
    )
    height = await page.evaluate("window.innerHeight")
    assert height - 40 <= bottom <= height, (bottom, height)
    # The drawer (the lead's JS toggles the class on a click of #drawer-toggle; toggled
    # directly here so this does not depend on it).
    await page.evaluate("document.body.classList.toggle('drawer-open')")
    await expect(page.locator("#sidebar")).to_be_in_viewport()
    await expect(page.locator("#join-input")).to_be_in_viewport()
    await page.screenshot(path=ARTIFACTS / "chat-phone-drawer.png", animations="disabled")
