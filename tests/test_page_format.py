"""The chat page's message formatting (``app/static/format.js``) in a real Chromium, loaded as
the page loads it (a same-origin module under the page's Content-Security-Policy): ``render``
builds only the elements it may (links with a checked ``href``, ``rel`` and ``target``; code
blocks; quotes; emphasis), markup and ``javascript:`` in a message stay text and run nothing,
and the lines a message is split into take the same room as its plain text would. The rules
themselves are tested in Node (``clients/js/test/format.test.mjs``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, Page

from tests.helpers import LiveServer
from tests.test_browser import browser  # noqa: F401  (the Chromium fixture)

pytestmark = pytest.mark.timeout(60)

REL = "noopener noreferrer nofollow ugc"
LINK = f'rel="{REL}" target="_blank"'

# Each text rendered into a detached <div>: its HTML, and its visible text.
RENDER = """async (texts) => {
  const { render } = await import("/static/format.js");
  return texts.map((text) => {
    const box = document.createElement("div");
    box.append(render(text));
    return [box.innerHTML, box.textContent];
  });
}"""


@pytest.fixture
async def page(browser: Browser, server: LiveServer) -> AsyncIterator[Page]:  # noqa: F811
    """The chat page, as anyone opens it (its CSP applies to what it imports)."""
    context = await browser.new_context()
    page = await context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if "Content Security" in m.text else None)
    await page.goto(f"{server.http_url}/?name=fmt&room=lobby")
    try:
        yield page
    finally:
        await context.close()
    assert not errors, errors


async def rendered(page: Page, texts: list[str]) -> list[tuple[str, str]]:
    """``render(text)`` of each of ``texts``: the HTML it makes, and its ``textContent``."""
    result: list[list[str]] = await page.evaluate(RENDER, texts)
    return [(html, text) for html, text in result]


async def test_render_builds_only_safe_elements(page: Page) -> None:
    cases = {
        "plain\n  text\twith <b>tags</b> & spaces\n": (
            '<div class="para">plain\n  text\twith &lt;b&gt;tags&lt;/b&gt; &amp; spaces\n</div>'
        ),
        "**bold** *it* _em_ ~~gone~~ `<i>code</i>` snake_case_name 2*3*4": (
            '<div class="para"><strong>bold</strong> <em>it</em> <em>em</em> <del>gone</del> '
            "<code>&lt;i&gt;code&lt;/i&gt;</code> snake_case_name 2*3*4</div>"
        ),
        "see https://en.wikipedia.org/wiki/Foo_(bar). or www.example.com!": (
            '<div class="para">see <a href="https://en.wikipedia.org/wiki/Foo_(bar)" '
            f"{LINK}>https://en.wikipedia.org/wiki/Foo_(bar)</a>. or "
            f'<a href="https://www.example.com/" {LINK}>www.example.com</a>!</div>'
        ),
        '```html\n<script>alert("**x**")</script>\n```\n> quoted *here*\nafter': (
            '<pre tabindex="0"><code data-lang="html">'
            '&lt;script&gt;alert("**x**")&lt;/script&gt;</code>\n'
            "</pre><blockquote>quoted <em>here</em>\n</blockquote>"
            '<div class="para">after</div>'
        ),
        "javascript:alert(1) [x](javascript:alert(1)) data:text/html,<b>x</b>": (
            '<div class="para">javascript:alert(1) [x](javascript:alert(1)) '
            "data:text/html,&lt;b&gt;x&lt;/b&gt;</div>"
        ),
    }
    results = await rendered(page, list(cases))
    for (text, expected), (html, _) in zip(cases.items(), results, strict=True):
        assert html == expected, text
    # The visible text is the message less its markers (fences, "> ", emphasis, backticks).
    assert [visible for _, visible in results] == [
        "plain\n  text\twith <b>tags</b> & spaces\n",
        "bold it em gone <i>code</i> snake_case_name 2*3*4",
        "see https://en.wikipedia.org/wiki/Foo_(bar). or www.example.com!",
        '<script>alert("**x**")</script>\nquoted here\nafter',
        "javascript:alert(1) [x](javascript:alert(1)) data:text/html,<b>x</b>",
    ]
    plain = "a message\n\n  with no markers, <b>tags</b> & www.x.org, kept exactly\n"
    assert (await rendered(page, [plain]))[0][1] == plain


async def test_links_are_http_with_rel_and_target(page: Page) -> None:
    links = await page.evaluate(
        """async () => {
          const { render } = await import("/static/format.js");
          const box = document.createElement("div");
          box.append(render("a HTTPS://Example.COM/x?y=1&z=2) b http://x.org c javascript:x"));
          return [...box.querySelectorAll("a")].map((a) => [a.protocol, a.href, a.rel, a.target]);
        }"""
    )
    assert links == [
        ["https:", "https://example.com/x?y=1&z=2", REL, "_blank"],
        ["http:", "http://x.org/", REL, "_blank"],
    ]


async def test_markup_in_a_rendered_message_runs_nothing(page: Page) -> None:
    evil = (
        '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
        '<svg onload="window.pwned=3"></svg> **<b onmouseover="window.pwned=4">b</b>** '
        'https://x.com/"onmouseover="window.pwned=5 `<iframe src=javascript:alert(1)>`'
    )
    found = await page.evaluate(
        """async (evil) => {
          const { render } = await import("/static/format.js");
          const box = document.createElement("div");
          box.append(render(evil));
          document.body.append(box); // attached, so anything that could run would
          await new Promise((resolve) => setTimeout(resolve, 200));
          const links = [...box.querySelectorAll("a")].map((a) => a.getAttribute("href"));
          const tags = [...box.querySelectorAll("*")].map((e) => e.localName);
          const handlers = [...box.querySelectorAll("*")].flatMap((e) => e.getAttributeNames())
            .filter((name) => name.startsWith("on"));
          box.remove();
          return { pwned: window.pwned ?? null, tags, links, handlers };
        }""",
        evil,
    )
    assert found["pwned"] is None
    assert found["tags"] == ["div", "strong", "a", "code"]
    assert found["links"] == ["https://x.com/"]
    assert found["handlers"] == []


async def test_lines_take_the_room_plain_text_would(page: Page) -> None:
    """In a ``white-space: pre-wrap`` box (as the page's ``.message .text``), paragraphs split
    at blank lines are exactly as tall as the same text unformatted: the "\\n" kept at the end
    of a block draws no extra line."""
    heights = await page.evaluate(
        """async (texts) => {
          const { render } = await import("/static/format.js");
          const measure = (content) => {
            const box = document.createElement("div");
            box.style.whiteSpace = "pre-wrap";
            box.style.width = "300px";
            box.append(content);
            document.body.append(box);
            const height = box.getBoundingClientRect().height;
            box.remove();
            return height;
          };
          return texts.map((text) => [measure(render(text)), measure(text)]);
        }""",
        ["a", "a\nb", "a\n\nb", "a\n\n\nb\n", "\n\nlead", "end\n\n"],
    )
    for ours, plain in heights:
        assert ours == plain and plain > 0, heights
