"""Who is connected where (app.ops.roster through the admin API): two servers on one Redis,
as two pods; every answer comes live from both, through Redis."""

from __future__ import annotations

import asyncio
import contextlib

import httpx2 as httpx
import pytest

from app.ops.roster import CLOSE_REASON
from tests.helpers import ChatClient
from tests.processes import RedisServer
from tests.test_redis_fanout import two_servers

pytestmark = pytest.mark.timeout(60)

TOKEN = "a" * 32
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


async def test_the_admin_api_lists_workers_and_a_users_connections_across_servers(
    redis_server: RedisServer,
) -> None:
    """alice on both servers (two tabs on one, one on the other), bob on one: the workers
    list both servers with their counts; alice's connections come from both, with the rooms
    each is in; a room's connections are its members'; closing one of alice's ends just that
    one, with 4003; the others stay."""
    async with (
        two_servers(redis_server, admin_token=TOKEN, rebalance_interval_s=0.2) as (a, b),
        contextlib.AsyncExitStack() as stack,
        httpx.AsyncClient() as http,
    ):
        tab1 = await stack.enter_async_context(ChatClient.connect(a.ws_url("alice")))
        tab2 = await stack.enter_async_context(ChatClient.connect(a.ws_url("alice")))
        other = await stack.enter_async_context(ChatClient.connect(b.ws_url("alice")))
        bob = await stack.enter_async_context(ChatClient.connect(b.ws_url("bob")))
        await tab1.join("lobby")
        await other.join("lobby")
        await other.join("dev")
        await bob.join("dev")

        async def census() -> list[tuple[int, bool]]:
            workers = (await http.get(f"{a.http_url}/admin/workers", headers=HEADERS)).json()
            return sorted((w["connections"], w["ready"]) for w in workers["workers"])

        async with asyncio.timeout(10):  # both have reported to the census
            while await census() != [(2, True), (2, True)]:
                await asyncio.sleep(0.1)

        found = (
            await http.get(f"{b.http_url}/admin/connections?user=alice", headers=HEADERS)
        ).json()
        assert found["workers_asked"] == 2 and found["workers_unanswered"] == []
        alices = found["connections"]
        assert len(alices) == 3 and {c["user"] for c in alices} == {"alice"}
        workers = {c["worker"] for c in alices}
        assert workers == {a.state.broker.worker_id, b.state.broker.worker_id}
        by_id = {c["id"]: c for c in alices}
        assert sorted(c["rooms"] for c in alices) == [[], ["dev", "lobby"], ["lobby"]]
        assert all(c["transport"] == "websocket" and c["queued_bytes"] >= 0 for c in alices)

        in_dev = (
            await http.get(f"{a.http_url}/admin/connections?room=dev", headers=HEADERS)
        ).json()["connections"]
        assert sorted(c["user"] for c in in_dev) == ["alice", "bob"]
        both = (
            await http.get(f"{a.http_url}/admin/connections?room=dev&user=bob", headers=HEADERS)
        ).json()["connections"]
        assert [c["user"] for c in both] == ["bob"]

        # Close alice's connection on server b, asked through server a.
        target = next(c for c in by_id.values() if c["worker"] == b.state.broker.worker_id)
        closed = await http.delete(
            f"{a.http_url}/admin/connections/{target['worker']}/{target['id']}", headers=HEADERS
        )
        assert closed.status_code == 204
        assert await other.closed_with() == 4003
        assert other.ws.close_reason == CLOSE_REASON
        again = await http.delete(
            f"{a.http_url}/admin/connections/{target['worker']}/{target['id']}", headers=HEADERS
        )
        assert again.status_code == 404
        left = (
            await http.get(f"{a.http_url}/admin/connections?user=alice", headers=HEADERS)
        ).json()["connections"]
        assert len(left) == 2 and target["id"] not in {c["id"] for c in left}
        await tab1.say("lobby", "still here")  # the others were not touched
        assert (await tab1.expect("message"))["text"] == "still here"
        assert tab2.ws.close_code is None


async def test_the_roster_answers_only_with_the_admin_token_and_checks_its_input(
    redis_server: RedisServer,
) -> None:
    async with (
        two_servers(redis_server, admin_token=TOKEN) as (a, _),
        httpx.AsyncClient() as http,
    ):
        url = a.http_url
        assert (await http.get(f"{url}/admin/workers")).status_code == 401
        assert (await http.get(f"{url}/admin/connections?user=x")).status_code == 401
        assert (await http.get(f"{url}/admin/connections", headers=HEADERS)).status_code == 422
        bad = await http.get(f"{url}/admin/connections?user=no%20spaces", headers=HEADERS)
        assert bad.status_code == 422
        not_ids = await http.delete(f"{url}/admin/connections/zz/yy", headers=HEADERS)
        assert not_ids.status_code == 422
        nobody = await http.delete(
            f"{url}/admin/connections/{'0' * 12}/{'0' * 12}", headers=HEADERS
        )
        assert nobody.status_code == 404  # no such worker listens: nothing held there
