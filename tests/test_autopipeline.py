"""AutoPipeline against a real redis-server: batching, per-caller results and errors,
script reloading, and a lost server."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.redisio.autopipeline import SERVER_RUN_ID, AutoPipeline, Merge, NotReplicated
from app.redisio.functions import RedisFunction
from tests.helpers import wait_until
from tests.processes import RedisServer

INCR_BY = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
FAIL_ON_NEGATIVE = "if tonumber(ARGV[1]) < 0 then return redis.error_reply('negative') end\n" + (
    "return redis.call('RPUSH', KEYS[1], ARGV[1])"
)


async def test_calls_of_one_iteration_share_one_pipeline_in_order(redis: Redis) -> None:
    pipeline = AutoPipeline(redis)
    push = redis.register_script(FAIL_ON_NEGATIVE)
    await redis.script_load(FAIL_ON_NEGATIVE)
    replies = await asyncio.gather(*(pipeline.call(push, ["log"], [i]) for i in range(200)))
    assert replies == list(range(1, 201))  # RPUSH returns the new length: one at a time
    assert [int(x) for x in await redis.lrange("log", 0, -1)] == list(range(200))
    assert pipeline.batches == 1


async def test_batches_are_capped(redis: Redis) -> None:
    pipeline = AutoPipeline(redis, max_batch=50)
    incr = redis.register_script(INCR_BY)
    await redis.script_load(INCR_BY)
    replies = await asyncio.gather(*(pipeline.call(incr, ["n"], [1]) for _ in range(120)))
    assert sorted(replies) == list(range(1, 121))
    assert pipeline.batches == 3


async def test_each_caller_gets_its_own_error(redis: Redis) -> None:
    pipeline = AutoPipeline(redis)
    push = redis.register_script(FAIL_ON_NEGATIVE)
    results = await asyncio.gather(
        pipeline.call(push, ["log"], [1]),
        pipeline.call(push, ["log"], [-1]),
        pipeline.call(push, ["log"], [2]),
        return_exceptions=True,
    )
    assert results[0] == 1 and results[2] == 2
    assert isinstance(results[1], ResponseError) and "negative" in str(results[1])


async def test_unknown_script_is_loaded_and_retried(redis: Redis) -> None:
    pipeline = AutoPipeline(redis)
    incr = redis.register_script(INCR_BY)
    assert await pipeline.call(incr, ["n"], [5]) == 5
    await redis.script_flush()  # as after a Redis restart
    replies = await asyncio.gather(*(pipeline.call(incr, ["n"], [1]) for _ in range(3)))
    assert sorted(replies) == [6, 7, 8]


async def test_calls_rerun_after_a_script_flush_keep_their_order(redis: Redis) -> None:
    pipeline = AutoPipeline(redis)
    push = redis.register_script(FAIL_ON_NEGATIVE)
    replies = await asyncio.gather(*(pipeline.call(push, ["log"], [i]) for i in range(100)))
    assert replies == list(range(1, 101))
    assert [int(x) for x in await redis.lrange("log", 0, -1)] == list(range(100))
    assert pipeline.batches == 1  # loaded before its first call: no NOSCRIPT, no rerun


async def test_a_lost_server_fails_every_caller_of_the_batch(
    redis_server: RedisServer, redis: Redis
) -> None:
    pipeline = AutoPipeline(redis)
    incr = redis.register_script(INCR_BY)
    assert await pipeline.call(incr, ["n"], [1]) == 1
    await redis_server.kill()
    results = await asyncio.gather(
        *(pipeline.call(incr, ["n"], [1]) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, (RedisConnectionError, OSError)) for r in results), results
    await redis_server.start()
    assert await pipeline.call(incr, ["n"], [1]) == 1  # a new server: it starts over


async def test_a_replica_is_refused_for_reads_and_writes(redis_server: RedisServer) -> None:
    """A Sentinel behind on a failover may name the old master, back as a replica: the
    pipeline does not use it (its reads would be stale, its writes refused); each caller is
    told why."""
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(redis_server.port)))
    await replica.start()
    client = Redis.from_url(replica.url, socket_timeout=2, socket_connect_timeout=2)
    try:
        pipeline = AutoPipeline(client)
        results = await asyncio.gather(
            pipeline.command("k", "GET", "k"),
            pipeline.call(client.register_script(INCR_BY), ["n"], [1]),
            return_exceptions=True,
        )
        for result in results:
            assert isinstance(result, RedisConnectionError), results
            assert "replica, not the master" in str(result)
        await pipeline.close()
    finally:
        await client.aclose()
        await replica.stop()


async def test_a_cancelled_caller_does_not_disturb_the_others(redis: Redis) -> None:
    pipeline = AutoPipeline(redis)
    incr = redis.register_script(INCR_BY)
    first = asyncio.ensure_future(pipeline.call(incr, ["n"], [1]))
    second = asyncio.ensure_future(pipeline.call(incr, ["n"], [10]))
    await asyncio.sleep(0)  # both are queued
    first.cancel()
    assert await second in (10, 11)  # the cancelled command may have been sent anyway
    with pytest.raises(asyncio.CancelledError):
        await first


async def _connected(server: RedisServer, timeout_s: float) -> tuple[Redis, AutoPipeline]:
    """A client with ``timeout_s`` per command, and a pipeline that has made one INCR_BY."""
    redis = Redis.from_url(server.url, socket_timeout=timeout_s, socket_connect_timeout=2)
    pipeline = AutoPipeline(redis)
    await redis.script_load(INCR_BY)
    assert await pipeline.call(redis.register_script(INCR_BY), ["n"], [1]) == 1
    return redis, pipeline


@contextlib.contextmanager
def _frozen(server: RedisServer) -> Iterator[None]:
    """SIGSTOP: the server is alive but silent, as a wedged host; SIGCONT after."""
    assert server.proc is not None
    server.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.proc.send_signal(signal.SIGCONT)


async def test_a_hung_server_times_the_calls_out_and_a_new_connection_follows(
    redis_server: RedisServer,
) -> None:
    redis, pipeline = await _connected(redis_server, timeout_s=0.5)
    incr = redis.register_script(INCR_BY)
    with _frozen(redis_server):
        results = await asyncio.wait_for(
            asyncio.gather(
                *(pipeline.call(incr, ["n"], [1]) for _ in range(3)), return_exceptions=True
            ),
            timeout=5,
        )
        assert all(isinstance(r, RedisTimeoutError) for r in results), results
    # The timed-out commands may still run once the server wakes up; ours come after them.
    assert await pipeline.call(incr, ["n"], [10]) in (11, 14)
    await pipeline.close()
    await redis.aclose()


async def test_close_fails_the_calls_still_waiting_or_queued(redis_server: RedisServer) -> None:
    redis, pipeline = await _connected(redis_server, timeout_s=30)
    incr = redis.register_script(INCR_BY)
    with _frozen(redis_server):
        sent = asyncio.ensure_future(pipeline.call(incr, ["n"], [1]))
        await wait_until(lambda: pipeline.batches == 2, timeout=5)
        queued = asyncio.ensure_future(pipeline.call(incr, ["n"], [1]))
        await asyncio.sleep(0)  # in the pipeline, not yet written
        await pipeline.close()
        for call in (sent, queued):
            with pytest.raises(RedisConnectionError):
                await asyncio.wait_for(call, timeout=2)
        with pytest.raises(RedisConnectionError):
            await pipeline.call(incr, ["n"], [1])  # closed for good
    await redis.aclose()


# A mergeable script: ARGV[1] once (shared), then one key and one argument per call; it logs
# each call's (shared, own) and answers {own, the run's number of calls} per call.
MERGEABLE = """
local replies = {}
for i = 1, #KEYS do
  redis.call('RPUSH', KEYS[i], ARGV[1] .. ':' .. ARGV[i + 1])
  replies[2 * i - 1], replies[2 * i] = ARGV[i + 1], #KEYS
end
return replies
"""


async def test_mergeable_calls_of_one_iteration_share_script_runs_in_order(
    redis: Redis,
) -> None:
    """Neighbouring calls of one group merge (at most ``max_merged`` in a run); a call of
    another group, or an unmergeable one, starts a new run; every caller gets its own reply
    and the server ran them in the order made; the shared first argument is the server's
    run_id where the callers passed SERVER_RUN_ID."""
    pipeline = AutoPipeline(redis, max_merged=4)
    merged = redis.register_script(MERGEABLE)
    incr = redis.register_script(INCR_BY)
    await redis.script_load(MERGEABLE)
    await redis.script_load(INCR_BY)
    run_id = (await redis.info("server"))["run_id"]
    a, b = Merge("a", 2), Merge("b", 2)
    calls = [
        *(pipeline.submit(merged, ["log"], [SERVER_RUN_ID, n], merge=a) for n in range(6)),
        pipeline.submit(incr, ["n"], [1]),
        pipeline.submit(merged, ["log"], [SERVER_RUN_ID, 6], merge=a),
        pipeline.submit(merged, ["log"], [SERVER_RUN_ID, 7], merge=b),
        pipeline.submit(merged, ["log"], [SERVER_RUN_ID, 8], merge=b),
    ]
    replies = await asyncio.gather(*calls)
    assert pipeline.batches == 1
    runs = [reply[1] for reply in replies[:6]] + [replies[7][1], replies[8][1], replies[9][1]]
    assert runs == [4, 4, 4, 4, 2, 2, 1, 2, 2]  # 4 + 2, then alone after the INCR, then 2
    assert [reply[0] for i, reply in enumerate(replies) if i != 6] == [
        str(n).encode() for n in range(9)
    ]
    assert replies[6] == 1
    assert await redis.lrange("log", 0, -1) == [f"{run_id}:{n}".encode() for n in range(9)]


# Each call: its own key (a list), then a shared key (a counter); a header of two arguments
# (the run_id, a step), then its own value. -> {value, the run's size} per call.
MERGEABLE_WITH_SHARED_PARTS = """
local calls = #KEYS - 1
local replies = {}
for i = 1, calls do
  redis.call('RPUSH', KEYS[i], ARGV[1] .. ':' .. ARGV[2 + i])
  redis.call('INCRBY', KEYS[#KEYS], ARGV[2])
  replies[2 * i - 1], replies[2 * i] = ARGV[2 + i], calls
end
return replies
"""


async def test_calls_merge_only_with_the_same_header_and_shared_keys(redis: Redis) -> None:
    """A Merge's shared arguments (the very same objects) and shared keys (equal) are passed
    once for the run; a call whose header is another object, or whose shared key differs,
    starts a run of its own."""
    pipeline = AutoPipeline(redis)
    script = redis.register_script(MERGEABLE_WITH_SHARED_PARTS)
    await redis.script_load(MERGEABLE_WITH_SHARED_PARTS)
    run_id = (await redis.info("server"))["run_id"]
    merge = Merge(0, 2, shared_args=2, shared_keys=1)
    header = (SERVER_RUN_ID, 10)
    other_header = (SERVER_RUN_ID, 1000)

    def call(key: str, shared: str, head: tuple[Any, ...], value: int) -> Any:
        return pipeline.submit(script, [key, shared], [*head, value], merge=merge)

    replies = await asyncio.gather(
        call("a", "total", header, 1),
        call("b", "total", header, 2),
        call("a", "total", header, 3),
        call("b", "total", other_header, 4),  # another header: a run of its own
        call("a", "other", other_header, 5),  # another shared key: one more
    )
    assert pipeline.batches == 1
    assert [reply[1] for reply in replies] == [3, 3, 3, 1, 1]
    assert [int(reply[0]) for reply in replies] == [1, 2, 3, 4, 5]
    assert await redis.lrange("a", 0, -1) == [f"{run_id}:{n}".encode() for n in (1, 3, 5)]
    assert await redis.lrange("b", 0, -1) == [f"{run_id}:{n}".encode() for n in (2, 4)]
    assert (await redis.get("total"), await redis.get("other")) == (b"1030", b"1000")


async def test_on_reply_is_told_once_replies_are_in_their_callers_hands(redis: Redis) -> None:
    """``on_reply`` runs when replies have been handed to their calls (the calls' futures
    are done by then): a plain call's as it is read, a merged run's once it is split."""
    calls: list[asyncio.Future[Any]] = []
    told: list[list[bool]] = []
    pipeline = AutoPipeline(redis, on_reply=lambda: told.append([c.done() for c in calls]))
    merged = redis.register_script(MERGEABLE)
    incr = redis.register_script(INCR_BY)
    await redis.script_load(MERGEABLE)
    await redis.script_load(INCR_BY)
    calls.append(pipeline.submit(incr, ["n"], [1]))
    await calls[0]
    assert told and told[-1] == [True]
    calls.clear()
    told.clear()
    calls.extend(
        pipeline.submit(merged, ["log"], [SERVER_RUN_ID, n], merge=Merge(0, 2)) for n in range(3)
    )
    await asyncio.gather(*calls)
    assert told[-1] == [True, True, True]
    assert [False, False, False] in told  # the run's reply was read before it was split


async def test_a_merged_runs_error_fails_each_of_its_calls(redis: Redis) -> None:
    pipeline = AutoPipeline(redis)
    merged = redis.register_script(MERGEABLE)
    await redis.script_load(MERGEABLE)
    await redis.set("not-a-list", "x")
    results = await asyncio.gather(
        pipeline.submit(merged, ["log"], [SERVER_RUN_ID, 1], merge=Merge(0, 2)),
        pipeline.submit(merged, ["not-a-list"], [SERVER_RUN_ID, 2], merge=Merge(0, 2)),
        return_exceptions=True,
    )
    assert all(isinstance(r, ResponseError) and "WRONGTYPE" in str(r) for r in results), results


async def test_each_connection_loads_a_script_before_its_first_call(
    redis_server: RedisServer,
) -> None:
    """Calls of a script Redis does not know yet, made in three iterations in a row, run in
    the order made, none refused with NOSCRIPT: the pipeline loads the script first on each
    connection (a NOSCRIPT rerun would run after calls sent in between: a restarted Redis
    numbered a room's first messages out of order). The same after SCRIPT FLUSH and a new
    connection."""
    redis = Redis.from_url(redis_server.url)
    pipeline = AutoPipeline(redis)
    push = redis.register_script(FAIL_ON_NEGATIVE)
    try:
        for round_ in range(2):
            await redis.script_flush()
            await redis.config_resetstat()
            calls = []
            for n in range(3):
                calls += [pipeline.call(push, [f"log{round_}"], [10 * n + i]) for i in range(5)]
                await asyncio.sleep(0)  # the next five in the next iteration
            await asyncio.gather(*calls)
            logged = [int(x) for x in await redis.lrange(f"log{round_}", 0, -1)]
            assert logged == sorted(logged) and len(logged) == 15
            assert "errorstat_NOSCRIPT" not in await redis.info("errorstats")
            pipeline.reconnect()  # the next round: a new connection, scripts flushed
    finally:
        await pipeline.close()
        await redis.aclose()


async def test_a_lost_wait_leaves_no_exception_unretrieved(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A durable call whose connection times out while its ``WAIT`` is pending fails its
    caller, and nothing else: no "exception was never retrieved" in the log (one per call
    filled a failover's log)."""
    redis = Redis.from_url(redis_server.url, socket_timeout=0.3)
    pipeline = AutoPipeline(redis, wait_replicas=1, wait_timeout_s=5)  # no replica: WAIT hangs
    incr = redis.register_script(INCR_BY)
    try:
        for _ in range(3):
            with pytest.raises(RedisTimeoutError):
                await pipeline.call(incr, ["n"], [1], durable=True)
        gc.collect()
        await asyncio.sleep(0)
        assert "never retrieved" not in caplog.text
    finally:
        await pipeline.close()
        await redis.aclose()


async def test_a_master_without_replicas_refuses_durable_calls_unless_available_is_chosen(
    redis_server: RedisServer, redis: Redis
) -> None:
    """``WAIT 1`` on a master with no replica: with ``wait_required`` (the default) the
    durable call fails with ``NotReplicated``; without it the call gets its reply, is
    counted, later calls stop waiting (answered at once, counted too), and once a replica
    is attached the pipeline waits for it again (its calls confirmed, no longer counted)."""
    incr = redis.register_script(INCR_BY)
    strict = AutoPipeline(redis, wait_replicas=1, wait_timeout_s=0.1)
    try:
        with pytest.raises(NotReplicated):
            await strict.call(incr, ["n"], [1], durable=True)
        assert strict.acked_without_replicas == 0
    finally:
        await strict.close()
    available = AutoPipeline(redis, wait_replicas=1, wait_timeout_s=0.1, wait_required=False)
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(redis_server.port)))
    try:
        # The refused call was written all the same (on the master): n is 1.
        assert await available.call(incr, ["n"], [1], durable=True) == 2  # after a short WAIT
        assert available.acked_without_replicas == 1
        began = asyncio.get_running_loop().time()
        assert await available.call(incr, ["n"], [1], durable=True) == 3
        assert asyncio.get_running_loop().time() - began < 0.09  # no WAIT any more
        await wait_until(lambda: available.acked_without_replicas == 2)  # counted once answered
        await replica.start()

        async with asyncio.timeout(15):  # the next ROLE (within a second) lists the replica
            while True:
                counted = available.acked_without_replicas
                await available.call(incr, ["n"], [1], durable=True)
                await asyncio.sleep(0.05)  # its count, if any, lands after the caller resumes
                if available.acked_without_replicas == counted:
                    break
        counted = available.acked_without_replicas
        for _ in range(3):  # each confirmed by the replica now
            await available.call(incr, ["n"], [1], durable=True)
        await asyncio.sleep(0.05)
        assert available.acked_without_replicas == counted
    finally:
        await available.close()
        await replica.stop()


LIBRARY = """#!lua name=hubbub_test_library
local calls = 0  -- the library's upvalue: kept from call to call until it is loaded again
local function appended(keys, args)
  calls = calls + 1
  local replies = {}
  for i = 1, #keys do
    redis.call('RPUSH', keys[i], args[1] .. ':' .. args[1 + i])
    replies[2 * i - 1], replies[2 * i] = args[1 + i], calls
  end
  return replies
end
redis.register_function('hubbub_test_append', appended)
"""


async def test_a_function_is_loaded_before_its_first_call_and_again_after_a_flush(
    redis: Redis,
) -> None:
    """A RedisFunction is called with FCALL: its library is loaded on the connection before
    the first call (Redis has none), calls of one iteration merge into one run (the library's
    top level ran once: its upvalue counts the runs), and after ``FUNCTION FLUSH`` the next call
    loads it again and runs, in order, rather than failing."""
    append = RedisFunction("hubbub_test_library", "hubbub_test_append", LIBRARY)
    pipeline = AutoPipeline(redis)
    run_id = (await redis.info("server"))["run_id"]
    merge = Merge(0, 2)

    def call(key: str, value: int) -> Any:
        return pipeline.submit(append, [key], [SERVER_RUN_ID, value], merge=merge)

    replies = await asyncio.gather(call("a", 1), call("b", 2), call("a", 3))
    assert pipeline.batches == 1
    assert [int(value) for value, _ in replies] == [1, 2, 3] and {n for _, n in replies} == {1}
    assert await call("a", 4) == [b"4", 2]  # the library's second run
    assert await call("b", 5) == [b"5", 3]
    await redis.function_flush()
    assert await call("a", 6) == [b"6", 1]  # loaded again: its upvalue starts anew
    assert await redis.lrange("a", 0, -1) == [f"{run_id}:{n}".encode() for n in (1, 3, 4, 6)]
    assert await redis.lrange("b", 0, -1) == [f"{run_id}:{n}".encode() for n in (2, 5)]
    await pipeline.close()
