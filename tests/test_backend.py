"""The application's backend and Hubbub: the backend API (service credential) and webhooks to a
real receiver that checks every signature. Real Redis, PostgreSQL, uvicorn and gunicorn."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from app.settings import SettingsError, load_settings
from tests.helpers import ChatClient, make_settings, run_server
from tests.processes import AppProcess, PostgresServer, RedisServer
from tests.test_durable import connected, redis_and_postgres
from tests.webhook_receiver import running_receiver

pytestmark = pytest.mark.timeout(120)

SERVICE = "s" * 40
HOOK_SECRET = "h" * 40
AUTH = {"Authorization": f"Bearer {SERVICE}"}


async def test_the_backend_api_manages_rooms_publishes_and_reads(tmp_path: Path) -> None:
    async with redis_and_postgres() as (redis, _, url):
        settings = make_settings(redis_url=redis.url, database_url=url, service_token=SERVICE)
        async with (
            run_server(settings) as live,
            httpx.AsyncClient(base_url=f"{live.http_url}/api/v1", headers=AUTH) as api,
            connected(live.ws_url("ada")) as ada,
            connected(live.ws_url("bob")) as bob,
        ):
            # A service credential, not a user's: anything else is refused.
            async with httpx.AsyncClient(base_url=f"{live.http_url}/api/v1") as anonymous:
                assert (await anonymous.get("/rooms/team")).status_code == 401
                wrong = {"Authorization": "Bearer " + "x" * 40}
                assert (await anonymous.get("/rooms/team", headers=wrong)).status_code == 401

            created = await api.post("/rooms", json={"room": "team", "private": True,
                                                     "title": "Team", "owner": "ada"})  # fmt: skip
            assert created.status_code == 201, created.text
            assert created.json()["members"] == {"ada": "owner"}
            assert (await api.post("/rooms", json={"room": "team"})).status_code == 409
            added = await api.put("/rooms/team/members/bob", json={"role": "admin"})
            assert added.json()["members"] == {"ada": "owner", "bob": "admin"}
            assert (await bob.expect("invited"))["role"] == "admin"
            rooms = (await api.get("/users/bob/rooms")).json()["rooms"]
            assert [(r["room"], r["role"], r["private"]) for r in rooms] == [
                ("team", "admin", True)
            ]

            await ada.join("team")
            await ada.expect("room")
            # Publishing is idempotent with a cid: the retry gets the first id, nothing twice.
            first = await api.post(
                "/rooms/team/messages", json={"text": "deploy at 5", "cid": "d1"}
            )
            assert first.status_code == 201 and first.json()["duplicate"] is False
            again = await api.post(
                "/rooms/team/messages", json={"text": "deploy at 5", "cid": "d1"}
            )
            assert again.json() == {"id": first.json()["id"], "duplicate": True}
            message = await ada.expect("message")
            assert (message["id"], message["user"], message["text"]) == (
                first.json()["id"], "system", "deploy at 5",
            )  # fmt: skip
            dm = await api.post("/users/bob/messages", json={"text": "your report is ready"})
            got = await bob.next_frame(skip=("ping", "presence", "member"))
            assert (got["type"], got["to"], got["user"], got["id"]) == (
                "message", "bob", "system", dm.json()["id"],
            )  # fmt: skip

            presence = (await api.get("/rooms/team/presence")).json()
            assert presence == {"room": "team", "count": 1, "users": ["ada"]}
            history = (await api.get("/rooms/team/messages")).json()
            assert [m["text"] for m in history["messages"]] == ["deploy at 5"]
            assert (await api.get("/users/bob/messages")).json()["messages"][0]["text"] == (
                "your report is ready"
            )

            # Bad input: clear answers, nothing changed.
            assert (await api.put("/rooms/nowhere/members/bob", json={})).status_code == 404
            assert (await api.delete("/rooms/team/members/cy")).status_code == 404
            assert (await api.post("/rooms", json={"room": "bad name"})).status_code == 422
            too_long = {"text": "x" * 4001}
            assert (await api.post("/rooms/team/messages", json=too_long)).status_code == 422
            assert (
                await api.put("/rooms/team/members/bob", json={"role": "king"})
            ).status_code == 422

            # Removing a member takes its socket out of the room; disconnecting closes it.
            assert (await api.delete("/rooms/team/members/ada")).status_code == 200
            while (frame := await ada.next_frame(skip=("ping", "presence", "member")))[
                "type"
            ] != "left":
                pass
            assert frame["reason"] == "removed"
            assert (await api.post("/users/bob/disconnect", json={})).status_code == 202
            assert await bob.closed_with() == 4003
            schema = (await api.get(f"{live.http_url}/openapi.json")).json()
            assert "/api/v1/rooms/{room}/members/{user}" in schema["paths"]


async def test_the_backend_api_is_off_without_a_service_token() -> None:
    async with run_server(make_settings()) as live, httpx.AsyncClient() as http:
        response = await http.get(f"{live.http_url}/api/v1/rooms/x", headers=AUTH)
        assert response.status_code == 404


def test_webhook_settings_are_checked_at_start() -> None:
    base: dict[str, Any] = {"auth_mode": "guest", "webhook_url": "http://hooks.example/x"}
    with pytest.raises(SettingsError, match="WEBHOOK_URL needs"):
        load_settings(**base)
    with pytest.raises(SettingsError, match="WEBHOOK_SECRET"):
        load_settings(**base, webhook_secret="short", redis_url="redis://localhost")
    with pytest.raises(SettingsError, match=r"unknown message\.deleted"):
        load_settings(auth_mode="guest", webhook_events="message.deleted,user.online")


async def test_webhooks_are_signed_and_retried_and_report_members_and_presence() -> None:
    """Every event reaches a receiver that checks the signature; a receiver that fails gets
    retries; user.offline waits out the grace period, and a quick reconnect fires nothing."""
    async with running_receiver(HOOK_SECRET) as receiver, redis_and_postgres() as (redis, _, url):
        settings = make_settings(
            redis_url=redis.url, database_url=url, service_token=SERVICE,
            webhook_url=receiver.url, webhook_secret=HOOK_SECRET, webhook_offline_grace_s=1.5,
        )  # fmt: skip
        receiver.fail_next = 3  # the first three attempts fail: retried
        async with (
            run_server(settings) as live,
            httpx.AsyncClient(base_url=f"{live.http_url}/api/v1", headers=AUTH) as api,
        ):
            async with ChatClient.connect(live.ws_url("ada")) as ada:
                await ada.expect("inbox")
                await ada.join("lobby")
                await ada.say("lobby", "hello", cid="m1")
                await api.post("/rooms", json={"room": "team", "owner": "ada"})
                await api.put("/rooms/team/members/bob", json={})
                await api.delete("/rooms/team/members/bob")
                await receiver.wait_for(lambda: len(receiver.of_type("member.removed")) == 1)
            # Gone and back within the grace period: nothing. Gone for good: user.offline.
            async with ChatClient.connect(live.ws_url("ada")) as ada:
                await ada.expect("inbox")
            await receiver.wait_for(lambda: receiver.of_type("user.offline"), timeout=15)
            metrics = (await api.get(f"{live.http_url}/metrics")).text

        assert receiver.refused_signatures == 0
        assert receiver.attempts >= len(receiver.events) + 3
        created = receiver.of_type("message.created")
        assert [(e["data"]["conversation"], e["data"]["message"]["text"]) for e in created] == [
            ("lobby", "hello")
        ]
        added = [(e["data"]["room"], e["data"]["user"], e["data"]["role"]) for e in
                 receiver.of_type("member.added")]  # fmt: skip
        assert sorted(added) == [("team", "ada", "owner"), ("team", "bob", "member")]  # unordered
        assert [e["data"]["user"] for e in receiver.of_type("user.online")] == ["ada"]
        assert [e["data"]["user"] for e in receiver.of_type("user.offline")] == ["ada"]
        assert 'hubbub_webhook_deliveries_total{outcome="failed"}' in metrics


def _workers_of(master: int) -> list[int]:
    """The pids of gunicorn's workers (its children), from /proc."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == master:
                children.append(int(entry.name))
    return children


async def test_no_webhook_is_lost_when_a_worker_is_killed(
    redis_server: RedisServer, postgres_server: PostgresServer
) -> None:
    """Gunicorn, two workers, each holding as many events as it may (4) while the receiver
    fails them; one worker is SIGKILLed. Every message published (acked) arrives at least
    once once the receiver is back: the survivor takes over what the dead one held."""
    url = await postgres_server.create_database("chat")
    async with running_receiver(HOOK_SECRET) as receiver:
        receiver.fail_next = 10**9  # failing, until the kill
        app = AppProcess(
            {"CHAT_REDIS_URL": redis_server.url, "CHAT_DATABASE_URL": url,
             "CHAT_SERVICE_TOKEN": SERVICE, "CHAT_WEBHOOK_URL": receiver.url,
             "CHAT_WEBHOOK_SECRET": HOOK_SECRET, "CHAT_WEBHOOK_CLAIM_AFTER_S": "2",
             "CHAT_WEBHOOK_EVENTS": "message.created", "CHAT_WEBHOOK_CONCURRENCY": "4"},
            gunicorn_workers=2,
        )  # fmt: skip
        await app.start()
        try:
            ids: list[int] = []
            async with httpx.AsyncClient(base_url=f"{app.http_url}/api/v1", headers=AUTH) as api:
                for n in range(60):
                    response = await api.post("/rooms/lobby/messages", json={"text": str(n)})
                    assert response.status_code == 201
                    ids.append(response.json()["id"])
                # Both workers hold 4 events each, retrying them: kill one.
                await receiver.wait_for(lambda: receiver.attempts >= 16)
                assert app.proc is not None
                victim = _workers_of(app.proc.pid)[0]
                os.kill(victim, signal.SIGKILL)
                receiver.fail_next = 0
                for n in range(60, 80):
                    try:
                        response = await api.post(
                            "/rooms/lobby/messages", json={"text": str(n), "cid": f"c{n}"}
                        )
                    except httpx.TransportError:  # the dying worker's connection
                        await asyncio.sleep(0.2)
                        continue
                    if response.status_code == 201:
                        ids.append(response.json()["id"])

            def all_seen() -> bool:
                return set(ids) <= {e["data"]["message"]["id"] for e in receiver.events}

            await receiver.wait_for(all_seen, timeout=60)
            assert receiver.refused_signatures == 0
            assert len(ids) >= 75
        finally:
            await app.stop()


async def test_webhooks_in_batches_carry_every_event_in_fewer_requests() -> None:
    """With CHAT_WEBHOOK_BATCH_MAX, events read together go in one signed request (a JSON
    array), retried together when it fails: every message still arrives."""
    async with running_receiver(HOOK_SECRET) as receiver, redis_and_postgres() as (redis, _, url):
        settings = make_settings(
            redis_url=redis.url, database_url=url, service_token=SERVICE,
            webhook_url=receiver.url, webhook_secret=HOOK_SECRET, webhook_batch_max=20,
            webhook_events=["message.created"],
        )  # fmt: skip
        receiver.fail_next = 2
        async with (
            run_server(settings) as live,
            httpx.AsyncClient(base_url=f"{live.http_url}/api/v1", headers=AUTH) as api,
        ):
            # Published at once, as busy rooms do: the dispatcher reads them together.
            responses = await asyncio.gather(
                *(api.post("/rooms/lobby/messages", json={"text": str(n)}) for n in range(100))
            )
            ids = [response.json()["id"] for response in responses]

            def all_seen() -> bool:
                return set(ids) <= {e["data"]["message"]["id"] for e in receiver.events}

            await receiver.wait_for(all_seen, timeout=30)
        assert receiver.refused_signatures == 0
        assert receiver.batches >= 1
        assert receiver.attempts < 100  # fewer requests than events


async def test_files_reach_the_backend_through_webhooks_and_the_api(tmp_path: Path) -> None:
    """A message with a file: its ``message.created`` webhook carries ``attachments``, and
    ``GET /api/v1/files/{id}`` gives the backend links to read it (404 for an unknown id)."""
    async with running_receiver(HOOK_SECRET) as receiver, redis_and_postgres() as (redis, _, url):
        settings = make_settings(
            redis_url=redis.url, database_url=url, service_token=SERVICE,
            webhook_url=receiver.url, webhook_secret=HOOK_SECRET, file_dir=tmp_path / "files",
        )  # fmt: skip
        async with (
            run_server(settings) as live,
            httpx.AsyncClient(base_url=f"{live.http_url}/api/v1", headers=AUTH) as api,
            ChatClient.connect(live.ws_url("ada")) as ada,
        ):
            await ada.expect("inbox")
            await ada.join("lobby")
            data = b"%PDF-1.4\nminutes"
            await ada.send({"type": "upload", "room": "lobby", "name": "minutes.pdf",
                            "size": len(data)})  # fmt: skip
            target = await ada.expect("upload")
            stored = await api.put(f"{live.http_url}{target['url']}", content=data)
            assert stored.status_code == 201
            await ada.say("lobby", "minutes", cid="m", attachments=[target["file"]])
            await receiver.wait_for(lambda: receiver.of_type("message.created"))
            links = await api.get(f"/files/{target['file']}")
            assert (await api.get("/files/abcdefghijklmnopqrstuv")).status_code == 404
        [created] = receiver.of_type("message.created")
        [attachment] = created["data"]["message"]["attachments"]
        assert attachment == {"id": target["file"], "name": "minutes.pdf", "size": len(data),
                              "type": "application/pdf", "image": False}  # fmt: skip
        assert links.status_code == 200 and links.json()["name"] == "minutes.pdf"
        assert links.json()["url"].startswith("/files/")
