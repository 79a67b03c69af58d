"""Reports of messages and the moderators' queue (docs/protocol.md, "Reports and
moderation"; app.moderation.reports), against real servers and a real store: who may report
what (the one access decision), what a report keeps, its quota, the queue as moderators see
it (only what they may read) and as the backend API does (everything), resolving (dismiss,
delete: every client hears it), the moderators' kick and ban in the page, and the signed
``message.reported`` webhook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.helpers import ChatClient, make_settings, run_server, wait_until
from tests.test_access import as_user, jwt_settings, token
from tests.test_durable import redis_and_postgres
from tests.test_notify import sent
from tests.test_rooms import answer
from tests.webhook_receiver import running_receiver

pytestmark = pytest.mark.timeout(120)

SERVICE = "a-service-token-of-at-least-32-characters"
MODERATOR = {"roles": ["moderator"]}


def report_frame(room: str, message_id: int, reason: str = "spam") -> dict[str, Any]:
    return {"type": "report", "room": room, "id": message_id, "reason": reason}


async def test_who_may_report_what_and_what_a_report_keeps(tmp_path: Path) -> None:
    """Anyone who may read a message reports it (the text as it was then is kept, and
    reporting again answers the same report); a private room's message cannot be reported
    by an outsider (the room answer), nor a message that does not exist or is deleted;
    bad input is a clear refusal; past the quota, ``rate_limited``."""
    settings = jwt_settings(tmp_path, user_report_burst=4, user_reports_per_s=0.001)
    async with (
        run_server(settings) as live,
        as_user(live, "ada") as ada,
        as_user(live, "carol") as carol,
        as_user(live, "eve") as eve,
    ):
        await answer(ada, {"type": "create", "room": "plans", "private": True}, "room")
        for client in (ada, carol):
            await answer(client, {"type": "join", "room": "lobby"}, "joined")
        await answer(ada, {"type": "join", "room": "plans"}, "joined")
        rude = await sent(ada, {"room": "lobby", "text": "something rude"})
        secret = await sent(ada, {"room": "plans", "text": "a secret"})
        await answer(
            ada, {"type": "edit", "room": "lobby", "id": rude["id"], "text": "x"}, "edited"
        )
        got = await answer(carol, report_frame("lobby", rude["id"], "insulting"), "reported")
        report = got["report"]
        assert report["message"] == {"id": rude["id"], "user": "ada", "text": "x"}
        assert (report["room"], report["reporter"], report["reason"], report["resolved"]) == (
            "lobby", "carol", "insulting", None,
        )  # fmt: skip
        again = await answer(carol, report_frame("lobby", rude["id"], "again"), "reported")
        assert again["report"] == report  # the first one, unchanged
        refused = await answer(eve, report_frame("plans", secret["id"]), "reported")
        assert (refused["code"], refused["message"]) == ("not_found", "room 'plans' not found")
        missing = await answer(carol, report_frame("lobby", rude["id"] + 1), "reported")
        assert missing["code"] == "not_found"
        empty = await answer(carol, report_frame("lobby", rude["id"], ""), "reported")
        assert empty["code"] == "bad_frame"
        await answer(ada, {"type": "delete", "room": "lobby", "id": rude["id"]}, "deleted")
        gone = await answer(eve, report_frame("lobby", rude["id"]), "reported")
        assert gone["code"] == "not_found"
        # carol's burst of 4: three tries used (the first, the repeat, the missing one).
        other = await sent(ada, {"room": "lobby", "text": "more"})
        assert (await answer(carol, report_frame("lobby", other["id"]), "reported"))["report"]
        limited = await answer(carol, report_frame("lobby", other["id"]), "reported")
        assert limited["code"] == "rate_limited"
        assert await carol.is_responsive()


async def test_moderators_work_the_queue_and_the_backend_sees_all_of_it(tmp_path: Path) -> None:
    """The queue: forbidden to users, open reports oldest first to moderators (only those of
    conversations they may read: not a private room they are not in), all of them to the
    backend API. Resolving with ``delete`` deletes the message for everyone; a resolved
    report is answered as it is; ``dismiss`` through the backend API."""
    settings = jwt_settings(tmp_path, service_token=SERVICE)
    service = {"Authorization": f"Bearer {SERVICE}"}
    async with (
        run_server(settings) as live,
        httpx.AsyncClient(base_url=live.http_url) as http,
        as_user(live, "ada") as ada,
        as_user(live, "bob") as bob,
        as_user(live, "mod", **MODERATOR) as mod,
    ):
        await answer(ada, {"type": "create", "room": "plans", "private": True}, "room")
        await answer(ada, {"type": "invite", "room": "plans", "user": "bob"}, "room")
        for client in (ada, bob):
            for room in ("lobby", "plans"):
                await answer(client, {"type": "join", "room": room}, "joined")
        rude = await sent(bob, {"room": "lobby", "text": "rude"})
        private = await sent(bob, {"room": "plans", "text": "rude in private"})
        first = (await answer(ada, report_frame("lobby", rude["id"]), "reported"))["report"]
        second = (await answer(ada, report_frame("plans", private["id"]), "reported"))["report"]

        refused = await answer(bob, {"type": "reports"}, "reports")
        assert refused["code"] == "forbidden"
        seen = await answer(mod, {"type": "reports"}, "reports")
        assert [r["id"] for r in seen["reports"]] == [first["id"]]  # not the private room's
        hidden = await answer(mod, {"type": "resolve", "id": second["id"], "action": "delete"},
                              "resolved")  # fmt: skip
        assert hidden["code"] == "not_found"
        queue = (await http.get("/api/v1/reports", headers=service)).json()
        assert [r["id"] for r in queue["reports"]] == [first["id"], second["id"]]
        assert queue["next"] is None

        done = await answer(mod, {"type": "resolve", "id": first["id"], "action": "delete"},
                            "resolved")  # fmt: skip
        assert done["report"]["resolved"]["by"] == "mod"
        assert done["report"]["resolved"]["outcome"] == "deleted"
        for client in (ada, bob):  # everyone in the room hears the deletion
            deleted = await client.expect("deleted")
            assert (deleted["target"], deleted["user"]) == (rude["id"], "mod")
        again = await answer(mod, {"type": "resolve", "id": first["id"], "action": "dismiss"},
                             "resolved")  # fmt: skip
        assert again["report"]["resolved"]["outcome"] == "deleted"  # as it was
        dismissed = await http.post(
            f"/api/v1/reports/{second['id']}/resolve", json={"action": "dismiss"}, headers=service
        )
        assert dismissed.json()["resolved"]["outcome"] == "dismissed"
        assert dismissed.json()["resolved"]["by"] == settings.service_user
        assert (await http.get("/api/v1/reports", headers=service)).json()["reports"] == []
        resolved = await http.get("/api/v1/reports", params={"resolved": "true"}, headers=service)
        assert [r["id"] for r in resolved.json()["reports"]] == [second["id"], first["id"]]
        assert (await http.post("/api/v1/reports/999/resolve", json={"action": "dismiss"},
                                headers=service)).status_code == 404  # fmt: skip
        assert (await http.get("/api/v1/reports")).status_code == 401
        counter = live.state.metrics.reports
        assert [counter.labels(o)._value.get() for o in ("reported", "deleted", "dismissed")] == [
            2, 1, 1,
        ]  # fmt: skip


async def test_moderators_kick_and_ban_from_the_page(tmp_path: Path) -> None:
    """A moderator's ``kick`` closes the user's connections (they may come back); ``ban``
    keeps them out; a user who is not a moderator gets ``forbidden``."""
    async with (
        run_server(jwt_settings(tmp_path)) as live,
        as_user(live, "mod", **MODERATOR) as mod,
        as_user(live, "eve") as eve,
    ):
        assert (await answer(eve, {"type": "kick", "user": "mod"}, "kicked"))["code"] == (
            "forbidden"
        )
        async with as_user(live, "troll") as troll:
            kicked = await answer(mod, {"type": "kick", "user": "troll"}, "kicked")
            assert kicked == {"type": "kicked", "user": "troll"}
            assert await troll.closed_with() == 4003
        async with as_user(live, "troll") as troll:  # back after a kick
            ban = {"type": "ban", "user": "troll", "duration_s": 60, "reason": "spam"}
            banned = await answer(mod, ban, "banned")
            assert (banned["user"], banned["duration_s"], banned["reason"]) == ("troll", 60, "spam")
            assert await troll.closed_with() == 4003
        with pytest.raises(ConnectionClosed) as refused:  # closed before its hello
            async with ChatClient.connect(f"{live.ws_url()}?token={token('troll')}"):
                pass
        assert refused.value.rcvd is not None and refused.value.rcvd.code == 4003


async def test_a_report_is_the_signed_message_reported_webhook(tmp_path: Path) -> None:
    """With webhooks (Redis, PostgreSQL): a new report is queued as ``message.reported``,
    signed, with the report; reporting again queues nothing more."""
    secret = "s" * 32
    async with running_receiver(secret) as receiver, redis_and_postgres() as (redis, _, url):
        settings = make_settings(
            redis_url=redis.url, database_url=url, webhook_url=receiver.url,
            webhook_secret=secret, webhook_events=["message.reported"],
        )  # fmt: skip
        async with (
            run_server(settings) as live,
            ChatClient.connect(live.ws_url("ada")) as ada,
            ChatClient.connect(live.ws_url("bob")) as bob,
        ):
            for client in (ada, bob):
                await client.expect("inbox")
                await answer(client, {"type": "join", "room": "lobby"}, "joined")
            rude = await sent(bob, {"room": "lobby", "text": "rude"})
            report = (await answer(ada, report_frame("lobby", rude["id"]), "reported"))["report"]
            await answer(ada, report_frame("lobby", rude["id"]), "reported")
            await wait_until(lambda: bool(receiver.of_type("message.reported")), timeout=20)
            [event] = receiver.of_type("message.reported")
            assert event["data"] == {"report": report}
