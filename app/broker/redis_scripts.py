"""The Lua scripts behind :class:`~app.broker.redis.RedisBroker`: each runs atomically in Redis.

Key layout for a room R (the hash tag keeps a room's keys in one cluster slot):
``{prefix}:{r:R}:meta`` hash {last: id of the newest message, origin, run, base: see
``INCARNATION``}, ``{prefix}:{r:R}:log`` the stream of the newest ``CHAT_HISTORY_SIZE + 1``
frames (the oldest marks where recovery can start), whose entry ids are ``<message id>-0``,
``{prefix}:{r:R}:cid:<user>:<cid>`` a dedup marker; the presence keys share the hash tag
(see :mod:`app.presence.redis`). The meta hash also holds ``archived``: every message of the
room up to that id is in the store (:mod:`app.store.stream_archiver` raises it), except
``unarchived``: the newest message that was not archived (the backlog was full). A direct
conversation has the same keys under its conversation name (``@a:b``, :mod:`app.conversation`).

With a store, every published frame is also appended to ``{prefix}:archive``, the stream the
archiver consumes (fields ``c``: the conversation, ``f``: the frame), unless it already holds
``CHAT_ARCHIVE_BACKLOG_MAX`` entries: then ``{prefix}:archive:dropped`` counts it instead.
"""

from __future__ import annotations

from typing import Final


def room_key(prefix: str, room: str, part: str) -> str:
    """The key ``part`` of ``room`` (its hash tag keeps a room's keys in one cluster slot)."""
    return f"{prefix}:{{r:{room}}}:{part}"


def archive_keys(prefix: str) -> tuple[str, str]:
    """The archive stream, and its count of messages not archived (the backlog was full)."""
    return f"{prefix}:archive", f"{prefix}:archive:dropped"


# `now`: Redis' clock in ms (every script that needs time starts with it).
NOW: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# A token bucket per key (a hash: t tokens, ts last refill in ms).
TOKEN_BUCKET: Final = """
local function take(key, rate, burst, now)
  local b = redis.call('HMGET', key, 't', 'ts')
  local tokens = tonumber(b[1]) or burst
  local ts = tonumber(b[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
  local ok = 0
  if tokens >= 1 then tokens = tokens - 1; ok = 1 end
  redis.call('HSET', key, 't', tostring(tokens), 'ts', tostring(now))
  redis.call('PEXPIRE', key, math.ceil(burst / rate * 1000) + 1000)
  return ok
end
"""

# A room's log incarnation. The log holds every message after `origin` (minus what trimming
# took) only while the Redis server that wrote it is the one answering: `run` is that server's
# run_id. A different run_id (a restart, even from an AOF that may miss its last second; a
# failover to a replica that may lag; or no meta at all: a new room, an expired one) starts a
# new incarnation whose origin is above every id handed out before (ids are time-based), so a
# `since` from before the break is answered `recovered:false` instead of a silent gap. `base`
# is the log's entries-added at that moment: entries trimmed after the origin are those beyond
# the log's length among the `added - base` added since.
INCARNATION: Final = """
local function entries_added(log)
  if log == '' or redis.call('EXISTS', log) == 0 then return 0 end
  local info = redis.call('XINFO', 'STREAM', log)
  for i = 1, #info, 2 do
    if info[i] == 'entries-added' then return info[i + 1] end
  end
  return nil  -- Redis < 7.0 does not say
end
local function incarnation(meta, log, ttl_ms)
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  local m = redis.call('HMGET', meta, 'last', 'origin', 'run', 'base')
  if m[3] == run then return tonumber(m[1]), tonumber(m[2]), tonumber(m[4]) end
  local origin = string.format('%.0f', math.max(tonumber(m[1] or '0'), now * 1000))
  local base = entries_added(log) or -1
  redis.call('HSET', meta, 'last', origin, 'origin', origin, 'run', run, 'base', base)
  redis.call('PEXPIRE', meta, ttl_ms)
  return tonumber(origin), tonumber(origin), base
end
"""

# Message ids: max(last + 1, 1000 * Redis time in ms). They increase per room and survive the
# loss of the room's keys (as long as Redis' clock does not go back), and stay below 2^53 so
# Lua's doubles and JavaScript clients hold them exactly.
# Returns {id, 0} published, {id, 1} a duplicate of message id, {0, 2} refused by the quota.
PUBLISH: Final = (
    NOW
    + TOKEN_BUCKET
    + INCARNATION
    + """
-- KEYS: meta, log (or '' for no history), dedup (or ''), the sender's message quota bucket,
--       the archive stream (or '' without a store), its count of messages not archived
-- ARGV: channel, head, body, log length (history size + 1), ttl_ms, dedup_ttl_ms,
--       second channel (or ''), quota rate per s, quota burst, conversation, archive length
-- -> {id, 0 published | 1 duplicate | 2 refused by the quota, ts_ms}
if take(KEYS[4], tonumber(ARGV[8]), tonumber(ARGV[9]), now) == 0 then
  return {0, 2, 0}
end
if KEYS[3] ~= '' then
  local first = redis.call('GET', KEYS[3])
  if first then return {first, 1, 0} end
end
local last = incarnation(KEYS[1], KEYS[2], ARGV[5])
local id = string.format('%.0f', math.max(last + 1, now * 1000))
-- The frame, as app.protocol.message_frame builds it from the same head and body.
local payload = ARGV[2] .. id .. ARGV[3] .. string.format('%.0f', now) .. '}'
redis.call('HSET', KEYS[1], 'last', id)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if KEYS[2] ~= '' then
  redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[4], id .. '-0', 'f', payload)
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
if KEYS[5] ~= '' then
  if redis.call('XLEN', KEYS[5]) < tonumber(ARGV[11]) then
    redis.call('XADD', KEYS[5], '*', 'c', ARGV[10], 'f', payload)
  else  -- the backlog is full (the store has been down for long): counted, not archived,
    -- and the room's store history has a hole here that recovery must not read across
    redis.call('INCR', KEYS[6])
    redis.call('HSET', KEYS[1], 'unarchived', id)
  end
end
-- Subscribers get the frame itself: workers of the previous release read it too (a rolling
-- deploy runs both), and the broker reads the id from it (app.protocol.message_id_of).
redis.call('PUBLISH', ARGV[1], payload)
if ARGV[7] ~= '' and ARGV[7] ~= ARGV[1] then redis.call('PUBLISH', ARGV[7], payload) end
if KEYS[3] ~= '' then redis.call('SET', KEYS[3], id, 'PX', ARGV[6]) end
return {id, 0, now}
"""
)

# One page of the replay after `since`: {1, more, id, frame, id, frame...} when every message
# after `since` is still retained (and there are at most `cap` of them), with at most `page`
# messages and more = 1 when others follow; {2, upto} when the log holds every message after
# `upto` and the store every one up to it (`archived`, and none after `since` was left out of
# the archive: `unarchived`), so the page comes from the store; {0, 0} when the client must
# resync. The log is a
# contiguous run of the newest messages of the incarnation (see INCARNATION), trimmed from its
# oldest end: the messages after `since` are all in it when `since` is not older than its oldest
# entry, or when nothing was trimmed since the origin. A log that is gone (history off, expired)
# answers {0, 0}.
HISTORY_SINCE: Final = (
    NOW
    + INCARNATION
    + """
-- KEYS: meta, log   ARGV: since, page, cap, ttl_ms
local since = tonumber(ARGV[1])
local last, origin, base = incarnation(KEYS[1], KEYS[2], ARGV[4])
if since > last or since < origin then return {0, 0} end
if since == last then return {1, 0} end
local oldest = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
if not oldest then return {0, 0} end
if since < tonumber(string.sub(oldest[1], 1, -3)) then
  local added = entries_added(KEYS[2])
  local length = redis.call('XLEN', KEYS[2])
  if not added or base < 0 or added - base > length then  -- trimmed: from the store?
    local marks = redis.call('HMGET', KEYS[1], 'archived', 'unarchived')
    local archived, hole = tonumber(marks[1] or '0'), tonumber(marks[2] or '0')
    local upto = tonumber(string.sub(oldest[1], 1, -3))
    if archived >= upto and since >= hole then return {2, string.format('%.0f', upto)} end
    return {0, 0}
  end
end
local page, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local start = string.format('%.0f', since + 1) .. '-0'
local entries = redis.call('XRANGE', KEYS[2], start, '+', 'COUNT', cap + 1)
if #entries > cap then return {0, 0} end
local out = {1, #entries > page and 1 or 0}
for i = 1, math.min(page, #entries) do
  out[#out + 1] = string.sub(entries[i][1], 1, -3)  -- the message id: '<id>-0'
  out[#out + 1] = entries[i][2][2]
end
return out
"""
)

# The id of the room's newest message, starting an incarnation when there is none (a quiet
# room's `last` is then its origin: a later `since` from it is vouched for).
LAST_ID: Final = (
    NOW
    + INCARNATION
    + """
-- KEYS: meta, log   ARGV: ttl_ms
return string.format('%.0f', incarnation(KEYS[1], KEYS[2], ARGV[1]))
"""
)

# Raise conversations' `archived` marks (never lower them), for the rooms whose meta exists
# (an expired room is not brought back by its archiving).
# KEYS: meta of each conversation   ARGV: the id archived up to, for each
ARCHIVED: Final = """
for i, meta in ipairs(KEYS) do
  if redis.call('EXISTS', meta) == 1 then
    local mark = tonumber(redis.call('HGET', meta, 'archived') or '0')
    if tonumber(ARGV[i]) > mark then redis.call('HSET', meta, 'archived', ARGV[i]) end
  end
end
return 0
"""
