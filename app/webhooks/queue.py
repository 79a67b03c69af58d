"""The webhook queue: appending events to it, and the online/offline bookkeeping.

Contract: :meth:`WebhookQueue.enqueue` appends one event (or, when the queue already holds
``CHAT_WEBHOOK_BACKLOG_MAX``, counts it as dropped: the backend has been failing for long);
``message.created`` is appended by the PUBLISH script itself
(:mod:`app.broker.redis_scripts`). ``user.online`` is queued when a user's first connection
anywhere opens, unless its ``user.offline`` is still waiting out the grace period (then
neither is sent); ``user.offline`` once the grace period after its last connection ended has
passed and it has not come back: :meth:`~WebhookQueue.offline_due` pops those atomically, so
one worker queues each. Calls raise :class:`~app.errors.BrokerUnavailable` when Redis cannot
be reached.
"""

from __future__ import annotations

import time
from typing import Any, Final

import orjson
from redis.asyncio import Redis

from app.broker.keys import KeyLayout
from app.redisio.clients import call_redis
from app.settings import Settings
from app.webhooks import ONLINE_ROOM, webhook_keys

# KEYS: queue, dropped   ARGV: backlog max, event, data (JSON)   -> 1 queued, 0 dropped
ENQUEUE: Final = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  redis.call('INCR', KEYS[2])
  return 0
end
redis.call('XADD', KEYS[1], '*', 'e', ARGV[2], 'd', ARGV[3])
return 1
"""

# A user's first connection anywhere: nothing if its offline was pending (a reconnect within
# the grace period), else user.online (when wanted).
# KEYS: offline pending, queue, dropped   ARGV: user, backlog max, data, wanted ('1'/'0')
ONLINE: Final = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then return 0 end
if ARGV[4] ~= '1' then return 0 end
if redis.call('XLEN', KEYS[2]) >= tonumber(ARGV[2]) then
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('XADD', KEYS[2], '*', 'e', 'user.online', 'd', ARGV[3])
return 1
"""

# The users whose grace period is over, popped (at most 100 at a time).
# KEYS: offline pending   ARGV: now ms
OFFLINE_DUE: Final = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)
for _, user in ipairs(due) do redis.call('ZREM', KEYS[1], user) end
return due
"""


class WebhookQueue:
    def __init__(self, redis: Redis, settings: Settings) -> None:
        self._redis = redis
        self._settings = settings
        self.queue, self.dropped, self._pending = webhook_keys(settings.redis_prefix)
        self._present = KeyLayout.of(settings).room(ONLINE_ROOM, "present")
        self._enqueue = redis.register_script(ENQUEUE)
        self._online = redis.register_script(ONLINE)
        self._offline_due = redis.register_script(OFFLINE_DUE)

    def wants(self, event: str) -> bool:
        return event in self._settings.webhook_events

    async def enqueue(self, event: str, data: dict[str, Any]) -> bool:
        """Queue ``event``; False when it was dropped (the backlog is full) or not wanted."""
        if not self.wants(event):
            return False
        args: list[str | int | bytes] = [
            self._settings.webhook_backlog_max, event, orjson.dumps(data),
        ]  # fmt: skip
        keys = [self.queue, self.dropped]
        return bool(await call_redis(lambda: self._enqueue(keys=keys, args=args)))

    async def user_arrived(self, user: str) -> None:
        keys = [self._pending, self.queue, self.dropped]
        data = orjson.dumps({"user": user})
        wanted = "1" if self.wants("user.online") else "0"
        args: list[str | int | bytes] = [user, self._settings.webhook_backlog_max, data, wanted]
        await call_redis(lambda: self._online(keys=keys, args=args))

    async def user_left(self, user: str) -> None:
        """The user's last connection anywhere ended: offline once the grace period is over."""
        due = int((time.time() + self._settings.webhook_offline_grace_s) * 1000)
        await call_redis(lambda: self._redis.zadd(self._pending, {user: due}))

    async def offline_due(self) -> int:
        """Queue ``user.offline`` for each user whose grace period is over and who has not
        come back; returns how many were queued."""
        now = int(time.time() * 1000)
        due = await call_redis(lambda: self._offline_due(keys=[self._pending], args=[now]))
        queued = 0
        for raw in due:
            user = raw.decode()
            score = await call_redis(lambda u=user: self._redis.zscore(self._present, u))  # type: ignore[misc]
            if score is not None and score >= now:
                continue  # back (on a worker whose arrival came before this departure)
            queued += await self.enqueue("user.offline", {"user": user})
        return queued
