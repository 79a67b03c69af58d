"""Redis with Sentinel: a real master, replica and three Sentinels on loopback
(:class:`~tests.processes.SentinelDeployment`). The workers find the master through the
Sentinels and follow its failover; with ``CHAT_REDIS_WAIT_REPLICAS`` an ack means a replica has
the message, so a SIGKILLed master loses no acked message."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from app.broker.redis import RedisBroker
from app.errors import BrokerUnavailable
from app.redisio.autopipeline import AutoPipeline, NotReplicated
from app.redisio.clients import close_client, command_client, subscriber_client
from app.redisio.subscription import Subscription
from app.settings import SettingsError, load_settings
from tests.helpers import (
    ChatClient,
    assert_live_delivery,
    free_port,
    make_settings,
    send_until_acked,
    wait_until,
)
from tests.processes import (
    FAILOVER_ENV,
    AppProcess,
    RedisServer,
    SentinelDeployment,
    wait_for_port,
)
from tests.test_broker_contract import Recorder
from tests.test_chaos import replicated_chaos_smoke

pytestmark = pytest.mark.timeout(120)

INCR = "return redis.call('INCR', KEYS[1])"


@pytest.fixture
async def sentinels() -> Any:
    deployment = SentinelDeployment()
    try:
        await deployment.start()
        yield deployment
    finally:
        await deployment.stop()


def test_sentinel_settings_are_checked() -> None:
    with pytest.raises(SettingsError, match="REDIS_SENTINELS: 'nope' is not host:port"):
        load_settings(redis_sentinels="nope", auth_mode="guest")
    with pytest.raises(SettingsError, match="exclude each other"):
        load_settings(
            redis_sentinels="127.0.0.1:26379", redis_url="redis://x:6379/0", auth_mode="guest"
        )
    with pytest.raises(SettingsError, match="REDIS_WAIT_TIMEOUT_S"):
        load_settings(redis_wait_replicas=1, redis_wait_timeout_s=3, auth_mode="guest")
    settings = load_settings(redis_sentinels="a:26379, b:26379", auth_mode="guest")
    assert settings.redis_sentinels == ["a:26379", "b:26379"] and settings.uses_redis


async def test_a_server_the_sentinels_name_that_is_a_replica_is_not_used(tmp_path: Path) -> None:
    """For a second or two after a failover a Sentinel not yet told of it names the old master,
    back as a replica. Here a Sentinel names a replica for good (it monitors it as a master,
    and takes a minute to find out): no command, subscription or pipeline of the app reads or
    subscribes there; each is refused, saying why."""
    master = RedisServer()
    await master.start()
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(master.port)))
    await replica.start()
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor {SentinelDeployment.NAME} 127.0.0.1 {replica.port} 1\n"
        f"sentinel down-after-milliseconds {SentinelDeployment.NAME} 60000\n"
    )
    sentinel = await asyncio.create_subprocess_exec(
        master.binary, str(conf), "--sentinel", stdout=asyncio.subprocess.DEVNULL
    )
    settings = make_settings(
        redis_sentinels=f"127.0.0.1:{port}", redis_sentinel_master=SentinelDeployment.NAME
    )
    redis = command_client(settings)
    subscriber = subscriber_client(settings)
    try:
        await wait_for_port(port, sentinel, "redis-sentinel")
        async with Redis(port=replica.port) as direct:
            assert (await direct.role())[0] == b"slave"
        with pytest.raises(RedisConnectionError, match="is not the master"):
            await redis.get("anything")
        with pytest.raises(RedisConnectionError, match="is not the master"):
            await Subscription.open(subscriber, lambda push: None)
        pipeline = AutoPipeline(redis)
        with pytest.raises(RedisConnectionError, match="is not the master"):
            await pipeline.command("anything", "GET", "anything")
        await pipeline.close()
    finally:
        await close_client(redis)
        await close_client(subscriber)
        sentinel.kill()
        await sentinel.wait()
        await replica.stop()
        await master.stop()


async def test_a_durable_call_is_answered_once_a_replica_has_it() -> None:
    """WAIT after the batch: with the replica up a durable call gets its reply; with it down
    the call fails with NotReplicated after the wait timeout (its write is on the master),
    while a call that is not durable is answered at once."""
    master = RedisServer()
    await master.start()
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(master.port)))
    await replica.start()
    redis = Redis.from_url(master.url)
    on_replica = Redis(port=replica.port)
    pipeline = AutoPipeline(redis, wait_replicas=1, wait_timeout_s=0.3)
    script = redis.register_script(INCR)
    try:
        async with asyncio.timeout(20):  # until the replica is in sync
            while (await pipeline.call(script, ["warm"], [], durable=False)) and not (
                await on_replica.get("warm")
            ):
                await asyncio.sleep(0.05)
        replies = await asyncio.gather(
            *(pipeline.call(script, ["k"], [], durable=True) for _ in range(5))
        )
        assert replies == [1, 2, 3, 4, 5]
        assert await on_replica.get("k") == b"5"  # the ack came after the copy
        await replica.kill()
        began = time.monotonic()
        with pytest.raises(NotReplicated):
            await pipeline.call(script, ["k"], [], durable=True)
        assert time.monotonic() - began >= 0.25
        assert await pipeline.call(script, ["k"], [], durable=False) == 7  # the write was done
    finally:
        await pipeline.close()
        await redis.aclose()
        await on_replica.aclose()
        await replica.stop()
        await master.stop()


async def test_a_planned_failover_moves_the_broker_to_the_new_master(
    sentinels: SentinelDeployment,
) -> None:
    """SENTINEL FAILOVER leaves the old master up, taking writes, until the Sentinels demote
    it seconds later: the broker follows their word within a canary interval, so publishes
    land on the new master and the subscription is back there."""
    settings = make_settings(
        redis_sentinels=sentinels.addresses,
        redis_timeout_s=1,
        canary_interval_s=0.2,
        canary_timeout_s=2,
        redis_reconnect_max_s=0.2,
    )
    broker = RedisBroker(settings)
    await broker.start(Recorder())
    new: Redis | None = None
    try:
        await wait_until(lambda: broker.ready, 10)
        await broker.publish("r", "u", "before", None)
        old = await sentinels.master_port()
        async with Redis(port=sentinels.sentinel_ports[0]) as sentinel:
            await sentinel.sentinel_failover(sentinels.NAME)
        new = Redis(port=await sentinels.wait_failover(old))
        landed = None
        # The Sentinels demote the old master some 10 s later (and kill its clients then).
        async with asyncio.timeout(4):
            while landed is None:
                with contextlib.suppress(BrokerUnavailable):
                    published = await broker.publish("r", "u", "after", None)
                    if await new.xrange(
                        "hubbub:{r:r}:log", f"{published.id}-0", f"{published.id}-0"
                    ):
                        landed = published
                await asyncio.sleep(0.05)
        await wait_until(lambda: broker.ready, 10)
    finally:
        if new is not None:
            await new.aclose()
        await broker.stop()


async def test_gunicorn_follows_a_sigkilled_master_and_loses_no_acked_message(
    sentinels: SentinelDeployment,
) -> None:
    """Two gunicorn workers on Sentinel, acks waiting for the replica. The master is
    SIGKILLed while a client sends: /readyz fails, then passes again once the Sentinels have
    promoted the replica and the workers resubscribed; every acked message is in the room's
    history afterwards, and live messages flow again between sockets on both workers."""
    app = AppProcess(
        {
            **FAILOVER_ENV,
            "CHAT_REDIS_SENTINELS": sentinels.addresses,
            "CHAT_REDIS_SENTINEL_MASTER": sentinels.NAME,
        },
        gunicorn_workers=2,
    )
    await app.start()
    acks: dict[str, int] = {}
    try:
        async with ChatClient.connect(app.ws_url("sender")) as sender:
            await sender.join("r")
            for n in range(20):
                await send_until_acked(sender, "r", f"before-{n}", acks)
            statuses: list[int] = []

            async def watch_readyz() -> None:
                """Until /readyz has failed and then passed again (each answer from either
                worker: the one answering may still be reconnecting when the other is back)."""
                while 503 not in statuses or 200 not in statuses[statuses.index(503) :]:
                    statuses.append(await app.readyz())
                    await asyncio.sleep(0.05)

            watcher = asyncio.create_task(watch_readyz())
            old = await sentinels.kill_master()
            sending = asyncio.create_task(send_until_acked(sender, "r", "during", acks))
            await sentinels.wait_failover(old)
            await sentinels.restart_killed()
            await app.wait_status(200)
            await sending
            for n in range(20):
                await send_until_acked(sender, "r", f"after-{n}", acks)
            # Not ready during the failover, ready again after it.
            try:
                async with asyncio.timeout(20):
                    await watcher
            except TimeoutError:
                raise AssertionError(f"/readyz answers, in order: {statuses}") from None
        # Every acked message survived, with the id its ack gave.
        async with httpx.AsyncClient() as http:
            page = (await http.get(f"{app.http_url}/rooms/r/messages?limit=100")).json()
        stored = {m["text"]: m["id"] for m in page["messages"]}
        assert {text: stored.get(text) for text in acks} == acks
        # Live delivery works again, across the workers (several receivers: both get some).
        await assert_live_delivery(app.ws_url, "r", "live")
    finally:
        await app.stop()


@pytest.mark.timeout(180)
async def test_chaos_smoke_on_sentinel_loses_no_acked_message(tmp_path: Path) -> None:
    """The chaos run on Sentinel (master SIGKILLed under 40 clients' traffic, a worker killed,
    PostgreSQL killed): no silent loss, duplicate or reordering, and every acked message is
    stored: none was lost with the master."""
    await replicated_chaos_smoke("--sentinel", tmp_path)
