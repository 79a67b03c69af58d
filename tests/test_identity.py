"""Who a connection is, by CHAT_AUTH_MODE: nobody can be anyone unless ops chose the `names`
mode for tests and load generators, and then the server says so.

- `jwt` is the default: a server without a key refuses to start, and says how to run guests;
- `guest`: `?name=` is a display name; the identity comes from the browser's own key, so a
  second `?name=bob` is somebody else, who gets neither bob's direct messages nor his slots.
  The key travels in the first frame (`?auth=frame`), never in a URL, and no log line shows
  it even when an old client puts it in the URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from app.access.guest import display_name, guest_user
from app.errors import CloseCode
from tests.helpers import ChatClient, make_settings, run_server, wait_until
from tests.processes import ROOT, AppProcess
from tests.test_security import refused_with

pytestmark = pytest.mark.timeout(60)


def test_the_default_is_jwt_and_without_a_key_the_server_refuses_to_start() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAT_")}
    result = subprocess.run(
        [sys.executable, "-m", "app"],
        cwd=ROOT,
        env=env | {"CHAT_PORT": "1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "CHAT_AUTH_MODE=jwt (the default) needs exactly one of CHAT_JWT_SECRET" in result.stderr
    assert "CHAT_AUTH_MODE=guest" in result.stderr


async def test_a_second_guest_with_the_same_name_is_someone_else() -> None:
    """Two `?name=bob`: two users. A direct message to the first (and his own copy of his
    reply) reaches only him; his key makes him himself again on a reconnect."""
    async with run_server(make_settings(auth_mode="guest")) as live:
        async with (
            ChatClient.connect(live.ws_url("bob")) as bob,
            ChatClient.connect(live.ws_url("bob")) as impostor,
            ChatClient.connect(live.ws_url("alice")) as alice,
        ):
            user, key = bob.hello["user"], bob.hello["guest"]
            assert user != impostor.hello["user"]
            assert display_name(user) == display_name(impostor.hello["user"]) == "bob"
            assert user == guest_user("bob", key)
            await alice.say_to(user, "for bob only")
            assert (await bob.expect("message"))["text"] == "for bob only"
            await bob.say_to(alice.hello["user"], "thanks")
            got = [m["text"] for m in await alice.messages_until("thanks")]
            assert got == ["for bob only", "thanks"]  # her own copy, then bob's reply
            # The impostor got neither: its next frame after both is the answer to a ping.
            assert await impostor.is_responsive()
        async with ChatClient.connect(f"{live.ws_url('bob')}&guest={key}") as again:
            assert again.hello["user"] == user and "guest" not in again.hello


@pytest.mark.parametrize(
    "query",
    ["name=bob&guest=short", "name=bob&guest=" + "x" * 129, "name=bob-0123456789abcdef"],
)
async def test_a_guest_cannot_pick_an_identity(query: str) -> None:
    """A key too short to be secret, or a name shaped like a guest id, is refused (1008)."""
    async with run_server(make_settings(auth_mode="guest")) as live:
        code, _ = await refused_with(f"ws://127.0.0.1:{live.port}/ws?{query}")
        assert code == 1008


async def test_names_mode_says_loudly_that_anyone_can_be_anyone() -> None:
    app = AppProcess({"CHAT_AUTH_MODE": "names"})
    await app.start()
    try:
        assert "anyone can be anyone" in app.output()
    finally:
        await app.stop()


@contextlib.asynccontextmanager
async def authenticated(url: str, auth: dict[str, Any]) -> AsyncIterator[ChatClient]:
    """A client that says who it is in its first frame, as hubbub.js does."""
    async with connect(url, open_timeout=5, close_timeout=2) as ws:
        await ws.send(orjson.dumps({"type": "auth"} | auth).decode())
        client = ChatClient(ws)
        client.hello = await client.next_frame()
        assert client.hello["type"] == "hello", client.hello
        yield client


async def test_a_guest_sends_its_key_in_the_first_frame_and_stays_itself() -> None:
    """`?auth=frame` and no secret in the URL: a new guest gets its key in `hello`, and the
    key in a reconnect's first frame makes it the same user (another key: someone else)."""
    async with run_server(make_settings(auth_mode="guest")) as live:
        url = f"ws://127.0.0.1:{live.port}/ws?auth=frame"
        async with authenticated(url, {"name": "bob"}) as bob:
            user, key = bob.hello["user"], bob.hello["guest"]
            assert user == guest_user("bob", key)
        async with authenticated(url, {"name": "bob", "guest": key}) as again:
            assert again.hello["user"] == user and "guest" not in again.hello
            assert await again.is_responsive()
        # The name may stay in the URL (it is no secret); the key comes in the frame.
        async with authenticated(f"{url}&name=bob", {"guest": key}) as same:
            assert same.hello["user"] == user
        async with authenticated(url, {"name": "bob", "guest": "k" * 24}) as other:
            assert other.hello["user"] == guest_user("bob", "k" * 24) != user
        # A key or name that could not be one is refused as in the URL (1008).
        for bad in ({"name": "bob", "guest": "short"}, {"name": "bob-0123456789abcdef"}):
            assert (await refused_with(url, {"type": "auth"} | bad))[0] == 1008


@pytest.mark.parametrize("mode", ["guest", "names"])
async def test_a_socket_that_does_not_say_who_it_is_is_closed_after_the_timeout(
    mode: str,
) -> None:
    """With `?auth=frame` the server sends nothing until the `auth` frame comes; without one
    within CHAT_AUTH_TIMEOUT_S, or with another frame first, it closes with 4001."""
    timeout_s = 0.5
    settings = make_settings(auth_mode=mode, auth_timeout_s=timeout_s)
    async with run_server(settings) as live:
        url = f"ws://127.0.0.1:{live.port}/ws?name=bob&auth=frame"
        async with connect(url, open_timeout=5) as ws:
            started = time.monotonic()
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(5):
                    frame = await ws.recv()
                    pytest.fail(f"the server spoke before the auth frame: {frame!r}")
            assert ws.close_code == CloseCode.AUTH_FAILED
            assert ws.close_reason == "no auth frame in time"
            assert time.monotonic() - started >= timeout_s * 0.9
        for first in ({"type": "join", "room": "lobby"}, {"type": "auth", "guest": 123}):
            assert (await refused_with(url, first))[0] == CloseCode.AUTH_FAILED
        assert live.state.pending_auth.total == 0
        # In `names` mode too, the frame says who the client is.
        async with authenticated(url, {"name": "ada"}) as ada:
            assert ada.hello["user"].startswith("ada")


async def test_no_log_line_carries_a_guest_key() -> None:
    """An old client's key in the URL (`?guest=`, even with its name percent-encoded) is
    redacted from uvicorn's WebSocket request lines, as are a new guest's key (sent in the
    first frame) and a refused key; nothing else of the log is lost."""
    old, encoded, refused = "o" * 20 + "LDKEY", "e" * 20 + "NCODED", "r" * 129
    app = AppProcess({"CHAT_AUTH_MODE": "guest", "CHAT_LOG_LEVEL": "debug"})
    await app.start()
    try:
        base = f"ws://127.0.0.1:{app.port}/ws"
        async with ChatClient.connect(f"{base}?name=ada&guest={old}") as ada:
            assert ada.hello["user"] == guest_user("ada", old)
        async with ChatClient.connect(f"{base}?name=ann&%67uest={encoded}") as ann:
            assert ann.hello["user"] == guest_user("ann", encoded)
        assert (await refused_with(f"{base}?name=bob&guest={refused}"))[0] == 1008
        async with authenticated(f"{base}?auth=frame", {"name": "cy"}) as cy:
            new = cy.hello["guest"]
        async with authenticated(f"{base}?auth=frame", {"name": "cy", "guest": new}) as again:
            assert again.hello["user"] == cy.hello["user"]
        # uvicorn's line for each socket names its path: wait until all five are in.
        await wait_until(lambda: app.output().count("WebSocket /ws?") >= 5)
        log = app.output()
        assert "WebSocket /ws?name=ada&guest=[redacted]" in log
        assert "WebSocket /ws?name=ann&%67uest=[redacted]" in log
        assert "WebSocket /ws?auth=frame" in log
        for secret in (old, encoded, refused, new):
            assert secret not in log
    finally:
        await app.stop()
