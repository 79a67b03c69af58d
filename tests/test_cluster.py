"""Redis Cluster: a real 3-master cluster with a replica each, made by `redis-cli --cluster
create` on loopback (:class:`~tests.processes.ClusterDeployment`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError

from app.access.quotas import RedisQuotas
from app.broker.keys import KeyLayout
from app.broker.redis import RedisBroker
from app.errors import BrokerUnavailable
from app.redisio.clients import close_client, cluster_client, node_client
from app.redisio.cluster import ClusterPipelines
from app.settings import SettingsError, load_settings
from tests.helpers import (
    ChatClient,
    assert_live_delivery,
    make_settings,
    run_server,
    send_until_acked,
    wait_until,
)
from tests.processes import FAILOVER_ENV, AppProcess, ClusterDeployment
from tests.test_broker_contract import Recorder
from tests.test_chaos import replicated_chaos_smoke
from tests.test_join_quota import QUOTAS as JOIN_QUOTAS
from tests.test_join_quota import assert_join_verdicts
from tests.test_security import refused_with

pytestmark = pytest.mark.timeout(120)

INCR = "return redis.call('INCR', KEYS[1])"


@pytest.fixture
async def cluster() -> AsyncIterator[ClusterDeployment]:
    deployment = ClusterDeployment()
    try:
        await deployment.start()
        yield deployment
    finally:
        await deployment.stop()


async def _command(node: Redis, *args: Any) -> Any:
    return await node.execute_command(*args)  # type: ignore[no-untyped-call]


def test_cluster_settings_are_checked() -> None:
    with pytest.raises(SettingsError, match="exclude each other"):
        load_settings(
            redis_cluster_nodes="127.0.0.1:7000", redis_url="redis://x:6379/0", auth_mode="guest"
        )
    with pytest.raises(SettingsError, match="REDIS_CLUSTER_NODES: 'x' is not host:port"):
        load_settings(redis_cluster_nodes="x", auth_mode="guest")
    with pytest.raises(SettingsError, match=r"message\.created is not supported"):
        load_settings(
            redis_cluster_nodes="127.0.0.1:7000", auth_mode="guest",
            webhook_url="http://127.0.0.1:9/hook", webhook_secret="s" * 32,
        )  # fmt: skip
    settings = load_settings(
        redis_cluster_nodes="a:7000,b:7000", auth_mode="guest",
        webhook_url="http://127.0.0.1:9/hook", webhook_secret="s" * 32,
        webhook_events="member.added,user.online",
    )  # fmt: skip
    assert settings.uses_redis and settings.redis_cluster_nodes == ["a:7000", "b:7000"]


def test_partitions_spread_evenly_over_the_slots() -> None:
    """Each partition's hash tag lands in its own slice of the 16,384 slots, and every key
    of a conversation (and its partition's archive stream) is in one slot."""
    layout = KeyLayout("hubbub", 64)
    slots = [key_slot(layout.archive(f"room{n}")[0].encode()) for n in range(2000)]
    assert len(set(slots)) == 64
    for n in range(50):
        room = f"room{n}"
        keys = [layout.room(room, part) for part in ("meta", "log", "state", "present")]
        keys += list(layout.archive(room))
        assert len({key_slot(key.encode()) for key in keys}) == 1
    tags = [key_slot(tag.strip("{}").encode()) for tag in layout._tags]
    assert [slot * 64 // 16384 for slot in tags] == list(range(64))
    assert KeyLayout("hubbub").room("r", "meta") == "hubbub:{r:r}:meta"  # one Redis: unchanged


def _node_client(node: ClusterNode) -> Redis:
    return node_client(make_settings(redis_timeout_s=2), node)


def _keys(count: int) -> list[str]:
    return [f"{{r:room{n}}}:meta" for n in range(count)]


async def test_calls_go_to_the_master_of_their_slot(cluster: ClusterDeployment) -> None:
    """Script calls on 60 rooms' keys are answered by the masters of their slots, in one
    pipeline per master, and in order per key."""
    client = RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
    await client.initialize()
    pipelines = ClusterPipelines(client, _node_client)
    script = client.register_script(INCR)
    try:
        keys = _keys(60)
        replies = await asyncio.gather(*(pipelines.call(script, [k], []) for k in keys * 3))
        assert replies == [1] * 60 + [2] * 60 + [3] * 60
        assert len(pipelines._pipelines) == 3  # one per master
        for key in keys[:5]:
            master = await cluster.master_of(key_slot(key.encode()))
            async with Redis(port=master.port) as node:
                assert await node.get(key) == b"3"
    finally:
        await pipelines.close()
        await close_client(client)


async def test_a_slot_missing_from_the_cache_is_a_redis_error(cluster: ClusterDeployment) -> None:
    """redis-py's slot cache without a key's slot (as it can be in the middle of a failover)
    fails the call with a Redis error, which the callers turn into ``broker_unavailable``,
    not a KeyError that would close the socket with 1011; the slots are read again, and the
    next call runs."""
    client = RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
    await client.initialize()
    pipelines = ClusterPipelines(client, _node_client)
    script = client.register_script(INCR)
    key = "{missing}:k"
    try:
        del client.nodes_manager.slots_cache[key_slot(key.encode())]
        with pytest.raises(RedisError):
            await pipelines.call(script, [key], [])
        await wait_until(
            lambda: key_slot(key.encode()) in client.nodes_manager.slots_cache, timeout=10
        )
        assert await pipelines.call(script, [key], []) == 1
    finally:
        await pipelines.close()
        await close_client(client)


async def test_a_moved_slot_is_followed(cluster: ClusterDeployment) -> None:
    """A slot given to another master (CLUSTER SETSLOT ... NODE on every master): the call
    sent to the old one is answered MOVED, the slots are reloaded and it runs on the new one."""
    client = RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
    await client.initialize()
    pipelines = ClusterPipelines(client, _node_client)
    script = client.register_script(INCR)
    key = "{moving}:k"
    slot = key_slot(key.encode())
    try:
        old = await cluster.master_of(slot)
        assert await pipelines.call(script, [key], []) == 1
        async with Redis(port=old.port) as node:
            await node.delete(key)  # an empty slot moves with CLUSTER SETSLOT
        target = next(node for node in client.get_primaries() if int(node.port) != old.port)
        async with Redis(port=int(target.port)) as node:
            target_id = (await _command(node, "CLUSTER", "MYID")).decode()
        for master in client.get_primaries():
            async with Redis(port=int(master.port)) as node:
                await _command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        assert await pipelines.call(script, [key], []) == 1  # re-routed, on an empty slot
        async with Redis(port=int(target.port)) as node:
            assert await node.get(key) == b"1"
    finally:
        await pipelines.close()
        await close_client(client)


async def test_a_sigkilled_master_is_replaced_by_its_replica(cluster: ClusterDeployment) -> None:
    """The master of a key's slot SIGKILLed: calls fail until the cluster has failed over
    (about a second), then run on the promoted replica, which has the earlier writes."""
    client = RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
    await client.initialize()
    pipelines = ClusterPipelines(client, _node_client, wait_replicas=1, wait_timeout_s=2)
    script = client.register_script(INCR)
    key = "{victim}:k"
    try:
        await cluster.wait_ok()
        for n in range(1, 4):  # each answered once the replica has it
            assert await pipelines.call(script, [key], [], durable=True) == n
        old = await cluster.master_of(key_slot(key.encode()))
        await old.kill()
        value = None
        async with asyncio.timeout(30):
            while value is None:
                with contextlib.suppress(RedisError, OSError):
                    value = await pipelines.call(script, [key], [])
                await asyncio.sleep(0.1)
        assert value >= 4  # on the promoted replica, which had the first three
        new = await cluster.master_of(key_slot(key.encode()))
        assert new is not old
    finally:
        await pipelines.close()
        await close_client(client)


async def test_a_cluster_client_closes_after_a_masters_failure(
    cluster: ClusterDeployment,
) -> None:
    """A command failed on a SIGKILLed master (redis-py then only marks the client for
    initializing again, and its own ``aclose`` closes nothing in that state):
    ``close_client`` leaves no connection open, on any node."""
    client = cluster_client(make_settings(redis_cluster_nodes=cluster.addresses.split(",")))
    keys = _keys(30)
    for key in keys:  # a connection to every master
        await client.set(key, "1")
    await (await cluster.master_of(key_slot(keys[0].encode()))).kill()
    with pytest.raises(RedisError):
        await client.get(keys[0])
    assert client._initialize  # the state in which RedisCluster.aclose() closes nothing
    await close_client(client)
    manager = client.nodes_manager
    nodes = [*manager.nodes_cache.values(), *manager.startup_nodes.values()]  # seeds: others
    assert [c for node in nodes for c in node._connections if c.is_connected] == []


async def test_gunicorn_on_the_cluster_survives_a_sigkilled_master(
    cluster: ClusterDeployment,
) -> None:
    """Two gunicorn workers on a 3-master cluster, rooms spread over the masters, acks
    waiting for the replica. The master of one room's slot is SIGKILLed while a client sends
    there, and restarted once its replica took over (with a single replica per master, acks
    in that shard wait for it): the sends are acked, every acked message (in every room) is in
    its room's history with the id its ack gave, and live delivery works across the workers."""
    app = AppProcess(
        {**FAILOVER_ENV, "CHAT_REDIS_CLUSTER_NODES": cluster.addresses},
        gunicorn_workers=2,
    )
    await app.start()
    layout = KeyLayout("hubbub", 64)
    rooms = [f"r{n}" for n in range(6)]
    masters = {
        (await cluster.master_of(key_slot(layout.tag(r).strip("{}").encode()))).port for r in rooms
    }
    assert len(masters) >= 2  # the rooms are spread over the masters
    acks: dict[str, int] = {}
    try:
        async with ChatClient.connect(app.ws_url("sender")) as sender:
            for room in rooms:
                await sender.join(room)
                await send_until_acked(sender, room, f"{room}-before", acks)
            slot = key_slot(layout.tag("r0").strip("{}").encode())
            victim = await cluster.master_of(slot)

            async def send_during() -> None:
                for n in range(5):
                    await send_until_acked(sender, "r0", f"r0-during-{n}", acks)

            sending = asyncio.create_task(send_during())
            await victim.kill()
            async with asyncio.timeout(30):  # its replica takes over
                while (await cluster.master_of(slot)) is victim:
                    await asyncio.sleep(0.1)
            # Back, as a replica of its old replica: the shard's acks can be confirmed again.
            await victim.start()
            await cluster.wait_ok()
            async with asyncio.timeout(60):
                await sending
            for room in rooms:
                await send_until_acked(sender, room, f"{room}-after", acks)
        async with httpx.AsyncClient() as http:
            for room in rooms:
                page = (await http.get(f"{app.http_url}/rooms/{room}/messages?limit=100")).json()
                stored = {m["text"]: m["id"] for m in page["messages"]}
                mine = {text: id_ for text, id_ in acks.items() if text.startswith(f"{room}-")}
                assert {text: stored.get(text) for text in mine} == mine, room
        await assert_live_delivery(app.ws_url, "r0", "r0-live")
    finally:
        await app.stop()


@pytest.mark.timeout(180)
async def test_chaos_smoke_on_the_cluster_loses_no_acked_message(tmp_path: Path) -> None:
    """The chaos run on Redis Cluster (a master SIGKILLed under 40 clients' traffic, a worker
    killed, PostgreSQL killed): no silent loss, duplicate or reordering, and every acked
    message is stored."""
    await replicated_chaos_smoke("--cluster", tmp_path)


async def test_per_user_quotas_hold_across_servers_on_the_cluster(
    cluster: ClusterDeployment,
) -> None:
    """Two servers on the cluster: a user's connection cap and message quota are shared (the
    admission script in the user's slot, the address bucket and the message quota taken apart,
    in their own slots)."""
    settings = make_settings(
        redis_cluster_nodes=cluster.addresses.split(","),
        max_connections_per_user=2,
        user_messages_per_s=0.01,
        user_message_burst=3,
    )
    async with run_server(settings) as a, run_server(settings) as b:
        await wait_until(lambda: a.state.broker.ready and b.state.broker.ready, 20)
        async with (
            ChatClient.connect(a.ws_url("ada")) as on_a,
            ChatClient.connect(b.ws_url("ada")) as on_b,
        ):
            code, reason = await refused_with(a.ws_url("ada"))
            assert (code, reason) == (4029, "too many connections for this user")
            for client in (on_a, on_b):
                await client.join("room")
            answers = []
            for n, client in enumerate([on_a, on_b, on_a, on_b]):
                await client.say("room", f"m{n}", cid=n)
                frame = await client.next_frame(skip=("ping", "presence", "message"))
                answers.append(frame.get("code", frame["type"]))
            assert answers == ["ack", "ack", "ack", "rate_limited"]


async def test_a_joins_quotas_on_the_cluster_are_asked_apart(cluster: ClusterDeployment) -> None:
    """The join's bucket, the new-room bucket and the room's key are in different slots:
    asked in three calls, each routed to its slot's master, with one Redis' answers."""
    settings = make_settings(redis_cluster_nodes=cluster.addresses.split(","), **JOIN_QUOTAS)
    quotas = RedisQuotas(settings)
    client = cluster_client(settings)
    try:
        await assert_join_verdicts(quotas, settings, client)
    finally:
        await quotas.close()
        await close_client(client)


async def test_the_broker_resubscribes_every_shard_after_losing_them(
    cluster: ClusterDeployment,
) -> None:
    """A broker in 12 rooms spread over the masters: its pub/sub connections killed (one per
    master, sharded, and a classic one), it subscribes again on each master (its rooms' shard
    channels, one canary per master; the classic one on any) and hears every room again."""
    broker = RedisBroker(
        make_settings(
            redis_cluster_nodes=cluster.addresses.split(","),
            canary_interval_s=0.2,
            canary_timeout_s=1,
            redis_reconnect_max_s=0.2,
        )
    )
    recorder = Recorder()
    await broker.start(recorder)
    rooms = [f"room{n}" for n in range(12)]
    try:
        await wait_until(lambda: broker.ready, 20)
        for room in rooms:
            await broker.subscribe_room(room)
        killed = 0
        for server in cluster.servers:  # every connection subscribed to a channel, sharded too
            async with Redis(port=server.port) as node:
                for client in await node.client_list():
                    if int(client.get("sub", 0)) or int(client.get("ssub", 0)):
                        killed += int(await node.client_kill_filter(_id=client["id"]))
        assert killed >= 1
        heard: set[str] = set()
        async with asyncio.timeout(20):  # each room's messages heard again
            while heard < set(rooms):
                for room in set(rooms) - heard:
                    with contextlib.suppress(BrokerUnavailable):
                        await broker.publish(room, "u", f"in {room}", None)
                await asyncio.sleep(0.3)
                heard = {r for r, _, _ in recorder.rooms}
        assert broker.ready
    finally:
        await broker.stop()


@pytest.mark.parametrize(
    ("victim_kind", "wait_policy"),
    [
        ("a master", None),
        ("the classic connection's master", None),
        ("a master", "available"),
    ],
)
async def test_a_masters_failure_touches_its_rooms_only(
    cluster: ClusterDeployment, victim_kind: str, wait_policy: str | None
) -> None:
    """A room on a healthy master goes on while another room's master is SIGKILLed: every
    send there acked at once (no ``broker_unavailable``), delivered live with no pause over
    a second, no ``resync``, the server ready throughout. The failed master's room is
    subscribed again once its replica took over: its member hears new messages live. The
    same when the master was also the one of the worker's classic pub/sub connection
    (users' and control channels), which moves to another master. With acks that wait for a
    replica and ``CHAT_REDIS_WAIT_POLICY=available``, the same, and the failed master's room
    is acked again (counted as without replicas) while its promoted replica has none."""
    waits = {}
    if wait_policy is not None:
        waits = {"redis_wait_replicas": 1, "redis_wait_timeout_s": 0.3,
                 "redis_wait_policy": wait_policy}  # fmt: skip
    settings = make_settings(
        redis_cluster_nodes=cluster.addresses.split(","),
        canary_interval_s=0.2, canary_timeout_s=2, redis_reconnect_max_s=0.3,
        redis_timeout_s=1, **waits,
    )  # fmt: skip
    layout = KeyLayout("hubbub", settings.redis_cluster_partitions)

    async def master_port(room: str) -> int:
        return (await cluster.master_of(key_slot(layout.tag(room).strip("{}").encode()))).port

    rooms = [f"room{n}" for n in range(40)]
    ports = {room: await master_port(room) for room in rooms}
    async with run_server(settings) as live:
        await wait_until(lambda: live.state.broker.ready, 20)
        doomed = rooms[0]
        if victim_kind != "a master":
            shards = live.state.broker._shards  # type: ignore[attr-defined]
            classic_port = shards.classic.writer.transport.get_extra_info("peername")[1]
            doomed = next(room for room in rooms if ports[room] == classic_port)
        healthy = next(room for room in rooms if ports[room] != ports[doomed])
        victim = await cluster.master_of(key_slot(layout.tag(doomed).strip("{}").encode()))
        async with (
            ChatClient.connect(live.ws_url("ada")) as ada,
            ChatClient.connect(live.ws_url("bob")) as bob,
        ):
            await ada.join(doomed)
            await bob.join(healthy)
            await victim.kill()
            ready_throughout = True
            delivered_at: dict[str, float] = {}
            loop = asyncio.get_running_loop()

            async def next_of_bob() -> dict[str, Any]:
                frame = await bob.next_frame(2, skip=("ping", "presence"))
                while frame.get("code") == "resync" and "to" in frame:
                    # Direct messages may be missing (the classic connection was lost): said
                    # once; nothing about the room.
                    frame = await bob.next_frame(2, skip=("ping", "presence"))
                assert frame["type"] != "error", frame  # no broker_unavailable, no resync
                if frame["type"] == "message":
                    delivered_at[frame["text"]] = loop.time()
                return frame

            for n in range(40):  # 4 s at 10 a second: a failover takes 1-2 s here
                ready_throughout &= live.state.broker.ready
                await bob.say(healthy, f"h{n}", cid=f"h{n}")
                while (await next_of_bob()).get("cid") != f"h{n}":  # until its ack
                    pass
                await asyncio.sleep(0.1)
            while len(delivered_at) < 40:  # a message may follow its ack
                await next_of_bob()
            assert ready_throughout
            times = [delivered_at[f"h{n}"] for n in range(40)]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert max(gaps) < 1.0, gaps
            # The failed master's room: subscribed again on the promoted replica.
            async with asyncio.timeout(30):
                while (await master_port(doomed)) == victim.port:
                    await asyncio.sleep(0.1)
            async with ChatClient.connect(live.ws_url("cy")) as cy:
                async with asyncio.timeout(20):  # joins are refused until it is subscribed
                    while True:
                        await cy.send({"type": "join", "room": doomed})
                        if (await cy.next_frame())["type"] == "joined":
                            break
                        await asyncio.sleep(0.2)
                await send_until_acked(cy, doomed, "after", {})
            async with asyncio.timeout(15):  # ada, in the room all along, hears it live
                while True:
                    frame = await ada.next_frame(15, skip=("ping", "presence", "ack", "error"))
                    if frame["type"] == "message" and frame["text"] == "after":
                        break
            if wait_policy == "available":  # the killed node is not back: no replica there
                assert live.state.broker.stats.acked_without_replicas >= 1
