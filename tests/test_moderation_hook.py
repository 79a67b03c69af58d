"""The moderation hook (docs/backend.md, "Moderation hook"; app.moderation.hook) against a real
endpoint on loopback (tests/moderation_hook_server.py) and a real server: every message,
direct message and edit is decided before it is published (accept, reject with a reason,
replace), signed; a failing, slow or confused endpoint is decided by the failure setting;
messages that wait go together in one request; the settings refuse an unsafe URL."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.helpers import ChatClient, LiveServer, make_settings, run_server
from tests.moderation_hook_server import ModerationServer, running_moderation
from tests.test_durable import connected
from tests.test_files import png, upload
from tests.test_rooms import answer

pytestmark = pytest.mark.timeout(120)

SECRET = "m" * 32


def hook_settings(tmp_path: Path, server: ModerationServer, **overrides: Any) -> Any:
    return make_settings(
        database_url=f"sqlite:///{tmp_path}/chat.db", moderation_hook_url=server.url,
        moderation_hook_secret=SECRET, **overrides,
    )  # fmt: skip


async def sent(client: ChatClient, frame: dict[str, Any]) -> dict[str, Any]:
    """Send ``frame`` (a ``send``); the message it made, as published (or the error)."""
    await client.send({"type": "send", **frame})
    while True:
        got = await client.next_frame(skip=("ping", "presence", "receipt", "inbox", "ack"))
        if got["type"] in ("message", "error"):
            return got


def decisions(live: LiveServer) -> dict[str, float]:
    counter = live.state.metrics.moderation_decisions
    return {
        d: counter.labels(d)._value.get()
        for d in ("accept", "reject", "replace", "failed_accept", "failed_reject")
    }


async def test_messages_dms_and_edits_are_accepted_rejected_or_replaced(tmp_path: Path) -> None:
    async with (
        running_moderation(SECRET) as hook,
        run_server(hook_settings(tmp_path, hook)) as live,
        connected(live.ws_url("ada")) as ada,
        connected(live.ws_url("bob")) as bob,
    ):
        for client in (ada, bob):
            await answer(client, {"type": "join", "room": "lobby"}, "joined")
        hello = await sent(ada, {"room": "lobby", "text": "hello"})
        assert hello["type"] == "message"
        refused = await sent(ada, {"room": "lobby", "text": "buy spam now"})
        assert (refused["code"], refused["message"], refused["ref"]) == (
            "rejected", "no spam here", "send",
        )  # fmt: skip
        replaced = await sent(ada, {"room": "lobby", "text": "darn it"})
        assert replaced["text"] == "d**n it"
        direct = await sent(ada, {"to": "bob", "text": "spam for you"})
        assert direct["code"] == "rejected"
        edit = {"type": "edit", "room": "lobby", "id": hello["id"], "text": "spam edit"}
        assert (await answer(ada, edit, "edited"))["code"] == "rejected"
        edit["text"] = "darn edit"
        assert (await answer(ada, edit, "edited"))["text"] == "d**n edit"
        # bob saw what was published only, as published.
        seen = [await bob.expect("message") for _ in range(2)]
        assert [m["text"] for m in seen] == ["hello", "d**n it"]
        assert (await bob.expect("edited"))["text"] == "d**n edit"
        page = await answer(bob, {"type": "history", "room": "lobby"}, "history")
        assert [m["text"] for m in page["messages"]] == ["d**n edit", "d**n it"]
        # Every request was signed; each item says what, where and who.
        assert hook.refused_signatures == 0
        first = hook.items[0]
        assert {k: first[k] for k in ("kind", "room", "user", "text", "attachments")} == {
            "kind": "message", "room": "lobby", "user": "ada", "text": "hello", "attachments": [],
        }  # fmt: skip
        assert [i.get("with") for i in hook.items if "with" in i] == [["ada", "bob"]]
        assert [i["kind"] for i in hook.items].count("edit") == 2
        assert decisions(live) == {
            "accept": 1, "reject": 3, "replace": 2, "failed_accept": 0, "failed_reject": 0,
        }  # fmt: skip


@pytest.mark.parametrize("policy", ["reject", "accept"])
async def test_a_failing_slow_or_confused_hook_is_decided_by_the_setting(
    policy: str, tmp_path: Path
) -> None:
    settings_ = {"moderation_hook_on_failure": policy, "moderation_hook_timeout_s": 0.3}
    async with (
        running_moderation(SECRET) as hook,
        run_server(hook_settings(tmp_path, hook, **settings_)) as live,
        connected(live.ws_url("ada")) as ada,
    ):
        await answer(ada, {"type": "join", "room": "lobby"}, "joined")
        outcomes = []
        for trouble in ("status", "slow", "malformed"):
            hook.status, hook.delay_s, hook.malformed = 200, 0.0, False
            if trouble == "status":
                hook.status = 500
            elif trouble == "slow":
                hook.delay_s = 1.0
            else:
                hook.malformed = True
            got = await sent(ada, {"room": "lobby", "text": f"when {trouble}"})
            outcomes.append(got.get("code") or got["text"])
        if policy == "reject":
            assert outcomes == ["moderation_unavailable"] * 3
        else:
            assert outcomes == ["when status", "when slow", "when malformed"]
        assert decisions(live)[f"failed_{policy}"] == 3
        hook.status, hook.delay_s, hook.malformed = 200, 0.0, False
        assert (await sent(ada, {"room": "lobby", "text": "fine again"}))["text"] == "fine again"
        assert await ada.is_responsive()


async def test_messages_waiting_for_the_hook_go_together(tmp_path: Path) -> None:
    """One request at a time (concurrency 1), each slow: what comes meanwhile from twenty
    senders goes in a few batches, never more than the batch size, each message decided."""
    settings = {"moderation_hook_concurrency": 1, "moderation_hook_batch_max": 8}
    async with (
        running_moderation(SECRET) as hook,
        run_server(hook_settings(tmp_path, hook, **settings)) as live,
    ):
        hook.delay_s = 0.2
        async with contextlib.AsyncExitStack() as stack:
            clients = []
            for n in range(20):
                client = await stack.enter_async_context(connected(live.ws_url(f"u{n}")))
                await answer(client, {"type": "join", "room": f"r{n}"}, "joined")
                clients.append(client)
            answers = await asyncio.gather(
                *(sent(c, {"room": f"r{n}", "text": f"hi {n}"}) for n, c in enumerate(clients))
            )
        assert [a.get("text") for a in answers] == [f"hi {n}" for n in range(20)], answers
        sizes = [len(batch) for batch in hook.batches]
        assert sum(sizes) == 20 and max(sizes) <= 8 and len(sizes) <= 6, sizes


def test_the_hook_must_be_https_and_signed() -> None:
    with pytest.raises(ValidationError, match="https"):
        make_settings(moderation_hook_url="http://hooks.example/m", moderation_hook_secret=SECRET)
    with pytest.raises(ValidationError, match="MODERATION_HOOK_SECRET"):
        make_settings(moderation_hook_url="https://hooks.example/m")
    assert (
        make_settings(
            moderation_hook_url="https://hooks.example/m", moderation_hook_secret=SECRET
        ).moderation_hook_url
        is not None
    )


async def test_the_hook_sees_a_messages_files(tmp_path: Path) -> None:
    """A message with a file: the hook gets the file's metadata (name, size, sniffed type)
    with the text, and a rejection frees the file for another message."""
    async with (
        running_moderation(SECRET) as hook,
        run_server(hook_settings(tmp_path, hook)) as live,
        connected(live.ws_url("ada")) as ada,
    ):
        await answer(ada, {"type": "join", "room": "lobby"}, "joined")
        file_id = await upload(live, ada, png(), "cat.png", room="lobby")
        refused = await sent(ada, {"room": "lobby", "text": "spam pic", "attachments": [file_id]})
        assert refused["code"] == "rejected"
        item = hook.items[-1]
        assert item["text"] == "spam pic"
        [seen] = item["attachments"]
        assert (seen["id"], seen["name"], seen["size"]) == (file_id, "cat.png", len(png()))
        ok = await sent(ada, {"room": "lobby", "text": "a cat", "attachments": [file_id]})
        assert [f["id"] for f in ok["attachments"]] == [file_id]
