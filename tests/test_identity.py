"""Who a connection is, by CHAT_AUTH_MODE: nobody can be anyone unless ops chose the `names`
mode for tests and load generators, and then the server says so.

- `jwt` is the default: a server without a key refuses to start, and says how to run guests;
- `guest`: `?name=` is a display name; the identity comes from the browser's own key, so a
  second `?name=bob` is somebody else, who gets neither bob's direct messages nor his slots.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.access.guest import display_name, guest_user
from tests.helpers import ChatClient, make_settings, run_server
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
