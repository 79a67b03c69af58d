"""The Lua scripts behind :class:`~app.broker.redis.RedisBroker`: each runs atomically in Redis.

Key layout for a room R (the hash tag keeps a room's keys in one cluster slot):
``{prefix}:{r:R}:meta`` hash {last: id of the newest message, or of one before it; origin, run,
base: see ``INCARNATION``}, ``{prefix}:{r:R}:log`` the stream of the newest
``CHAT_HISTORY_SIZE + 1`` frames (the oldest marks where recovery can start), whose entry ids
are ``<message id>-0``, ``{prefix}:{r:R}:cid:<user>:<cid>`` a dedup marker; the presence keys
share the hash tag (see :mod:`app.presence.redis`). The meta hash also holds ``archived``:
every message of the room up to that id is in the store (:mod:`app.store.stream_archiver`
raises it), except ``unarchived``: the newest message that was not archived (the backlog was
full). A direct conversation has the same keys under its conversation name (``@a:b``,
:mod:`app.conversations.names`).

With a store, every published frame is also appended to ``{prefix}:archive``, the stream the
archiver consumes (fields ``c``: the conversation, ``f``: the frame), unless it already holds
``CHAT_ARCHIVE_BACKLOG_MAX`` entries: then ``{prefix}:archive:dropped`` counts it instead.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from app.broker.keys import KeyLayout
from app.redisio.functions import RedisFunction


def room_key(prefix: str, room: str, part: str) -> str:
    """The key ``part`` of ``room`` on one Redis (see :class:`app.broker.keys.KeyLayout`)."""
    return KeyLayout(prefix).room(room, part)


def sharded(script: str, cluster: bool) -> str:
    """``script`` for one Redis (a room's channel is published with ``PUBLISH``) or for Redis
    Cluster (with ``SPUBLISH``: sharded pub/sub, the channel in the room's slot). On Redis
    Cluster every key a script is given must be in its conversation's slot, '' included: an
    absent key is passed as :data:`ABSENT` under the conversation's hash tag instead, and the
    script sees it as ''."""
    if not cluster:
        return f"local ROOM_PUBLISH = 'PUBLISH'\n{script}"
    return (
        "local ROOM_PUBLISH = 'SPUBLISH'\n"
        f"for i = 1, #KEYS do if string.sub(KEYS[i], -2) == '{ABSENT}' then KEYS[i] = '' end end\n"
        f"{script}"
    )


# The last characters of a key that stands for none (see sharded); no real key ends so.
ABSENT: Final = ":-"


def archive_keys(prefix: str) -> tuple[str, str]:
    """The archive stream on one Redis, and its count of messages not archived."""
    return KeyLayout(prefix).archive("")


# `now`: Redis' clock in ms (every script that needs time starts with it), and as text.
# Numbers become text with '%d' (Lua 5.1 formats it as a C long: exact for every id and time
# here, all below 2^53, on the 64-bit servers Redis ships for), not '%.0f', whose exact
# decimal conversion of a double is several times slower: a publish writes three.
NOW_VARIABLES: Final = "local now, now_text\n"
SET_NOW: Final = """
do
  local t = redis.call('TIME')
  -- arithmetic reads each text as a number once; tonumber() would read it twice
  now = t[1] * 1000 + math.floor(t[2] / 1000)
  now_text = string.format('%d', now)
end
"""
NOW: Final = NOW_VARIABLES + SET_NOW

# A token bucket per key: `rate` tokens a second, at most `burst`, one taken per call. Kept
# as GCRA (the generic cell rate algorithm, the same decisions): the key is a string, the
# time at which the bucket is full again (a time past is a full bucket, as no key is), in µs
# as 'x' and hex digits (text made and read cheaply, where a decimal fraction takes glibc's
# slow paths both ways; a time in ms with a fraction, as written before, is still read, and a
# worker of that release reads the new form as no time, a full bucket, for a deploy's length).
# Most takes find the bucket full (a chat user sends less often than the rate), so the first
# call sets it as a full bucket less one token and reads the time it held (`SET … GET`): one
# call. A bucket that was not full is set again from the time it held (a second call), or,
# when it has no token left, set back to that time. The key expires once the bucket is full
# again, but not within 10 s: a user who keeps sending keeps one key rather than one made
# and expired again and again. The texts of a full bucket are made once for a `now` and a rate
# (BUCKET_VARIABLES). A script (not the publishing library, below) makes each function it
# defines anew on every run, closures and upvalues, then collects them: its helpers are few.
TAKE_FUNCTION: Final = """
local function take(key, rate, burst, now)
  local interval = 1000 / rate
  if interval ~= full_interval or now ~= full_now then
    if interval ~= full_interval then
      full_ttl = string.format('%d', math.max(math.ceil(interval), 10000))
    end
    if now ~= full_now then now_hex = 'x' .. string.format('%x', now * 1000) end
    full_interval, full_now = interval, now
    full_text = 'x' .. string.format('%x', math.floor((now + interval) * 1000 + 0.5))
  end
  local held = redis.call('SET', key, full_text, 'PX', full_ttl, 'GET')
  -- full when it held no time, or a time not after now: as texts of as many hex digits
  if not held or (string.byte(held, 1) == 120 and #held == #now_hex and held <= now_hex) then
    return 1
  end
  local full_at
  if string.byte(held, 1) == 120 then
    full_at = tonumber(string.sub(held, 2), 16) / 1000
  else
    full_at = tonumber(held) or now
  end
  if full_at <= now then return 1 end
  if full_at + interval - now > burst * interval then
    redis.call('SET', key, held, 'PX',
               string.format('%d', math.max(math.ceil(full_at - now), 10000)))
    return 0
  end
  full_at = full_at + interval
  redis.call('SET', key, 'x' .. string.format('%x', math.floor(full_at * 1000 + 0.5)), 'PX',
             string.format('%d', math.max(math.ceil(full_at - now), 10000)))
  return 1
end
"""
# The text and ttl of a full bucket less one token, for the interval and the time they were
# made at, and `now` as a bucket's text: a run's takes mostly share one interval and `now`,
# and the publishing library keeps them from one call to the next (remade when either differs).
BUCKET_VARIABLES: Final = "local full_interval, full_now, full_text, full_ttl, now_hex\n"
TOKEN_BUCKET: Final = BUCKET_VARIABLES + TAKE_FUNCTION

# A room's log incarnation. The log holds every message after `origin` (minus what trimming
# took) only while the Redis server that wrote it is the one answering: `run` is that server's
# run_id. A different run_id (a restart, even from an AOF that may miss its last second; a
# failover to a replica that may lag; or no meta at all: a new room, an expired one) starts a
# new incarnation whose origin is above every id handed out before (ids are time-based), so a
# `since` from before the break is answered `recovered:false` instead of a silent gap. `base`
# is the log's entries-added at that moment: entries trimmed after the origin are those beyond
# the log's length among the `added - base` added since.
# The run_id is the caller's `run` when it knows it (the server at the other end of its
# connection: app.redisio.autopipeline learns it once per connection), else asked with
# `INFO server` (which costs a publish a fifth of its time). `incarnation` returns `last`,
# `origin` and `base` as Redis holds them, as text (a publish compares ids as text, by length
# then characters: reading a 16-digit number costs more than the comparison); `publishing`, `last`
# and when the keys' expiry is next due instead (`dl` with a log, `dm` without; nil in a new
# incarnation): see EXPIRY.
# The meta's `last` may be behind the log's newest entry: with CHAT_REDIS_NEWEST_ID_IN_META
# off, a send in a room with a log writes it only with the expiry's push (the log's newest
# entry is the room's newest message: room logs are trimmed from their oldest end only, never
# XDEL'd). So every reader takes the larger of the two (`newest`): `incarnation` for a join's
# `last`, a replay and a new origin; a publish, whose log refuses an id not above its newest
# entry, when the log refuses it (see publish_frame). Releases before 2de6863 read only
# `last`: while one of their workers runs, the setting is to be on (it defaults to off).
INCARNATION: Final = """
local function entries_added(log)
  if log == '' or redis.call('EXISTS', log) == 0 then return 0 end
  local info = redis.call('XINFO', 'STREAM', log)
  for i = 1, #info, 2 do
    if info[i] == 'entries-added' then return info[i + 1] end
  end
  return nil  -- Redis < 7.0 does not say
end
local function server_run(run)  -- the caller's run_id, else Redis' own
  if run == nil or run == '' then
    return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  end
  return run
end
local function newest(log, last)  -- the larger of `last` (or false) and the log's newest id
  if log == '' then return last end
  local entry = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)[1]
  if not entry then return last end
  local logged = string.sub(entry[1], 1, -3)  -- the message id: '<id>-0'
  if not last or #logged > #last or (#logged == #last and logged > last) then
    return logged
  end
  return last
end
local function incarnation(meta, log, ttl_ms, run, publishing)
  run = server_run(run)
  local m
  if publishing then  -- what a publish reads: no origin nor base; its log checks `last`
    m = redis.call('HMGET', meta, 'last', 'run', log == '' and 'dm' or 'dl')
    if m[2] == run then return m[1], nil, nil, m[3] or nil end
  else
    m = redis.call('HMGET', meta, 'last', 'origin', 'run', 'base')
    if m[3] == run then return newest(log, m[1]), m[2], m[4], nil end
  end
  local above = newest(log, m[1]) or '0'
  local origin = string.format('%d', math.max(tonumber(above), now * 1000))
  local base = string.format('%d', entries_added(log) or -1)
  redis.call('HSET', meta, 'last', origin, 'origin', origin, 'run', run, 'base', base)
  redis.call('HDEL', meta, 'dl', 'dm', 'tl', 'tm')
  redis.call('PEXPIRE', meta, ttl_ms)
  return origin, origin, base, nil
end
"""

# A room's keys live `ttl` after its last message. Pushing their expiry back on every message
# cost two calls each; instead it is pushed back to 9/8 of the ttl once an eighth of it has
# passed since the last push: meta's `dl` (`dm` without a log) is when, in ms, as text
# (workers of the release before kept when it was last pushed in `tl`/`tm`, and push by
# those). So the keys still live at least `ttl` after the last message and at most an eighth
# more. A new incarnation (a new log, perhaps) pushes at once.
EXPIRY: Final = """
local function push_expiry(meta, log, ttl_ms)  -- -> meta's field for the next due time, its value
  local ttl = tonumber(ttl_ms)
  redis.call('PEXPIRE', meta, math.ceil(ttl * 9 / 8))
  if log ~= '' then redis.call('PEXPIRE', log, math.ceil(ttl * 9 / 8)) end
  return log == '' and 'dm' or 'dl', string.format('%d', now + math.ceil(ttl / 8))
end
"""

# A token from a bucket. KEYS: bucket   ARGV: rate, burst   -> 1 taken, 0 refused
TAKE: Final = NOW + TOKEN_BUCKET + "return take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), now)"

# Message ids: max(last + 1, 1000 * Redis time in ms). They increase per room and survive the
# loss of the room's keys (as long as Redis' clock does not go back), and stay below 2^53 so
# Lua's doubles and JavaScript clients hold them exactly. Messages and events (edits, deletes,
# reactions: app.conversations.lifecycle) are numbered in the same sequence.
# The publishing scripts (PUBLISH, EVENT) start their arguments with a header that is the same
# for every message of a run, and end their keys with keys that are too, so that the messages
# of one loop iteration pass them once (app.redisio.autopipeline.Merge: each argument and key
# costs Redis a Lua string and a slot in a table, a tenth of a publish's work for a message's
# twenty):
# ARGV header: the run_id of the Redis server (see INCARNATION; '' to ask), then the settings
#   as one text, separated by spaces (see publishing_header): log length (history size + 1),
#   ttl_ms, dedup_ttl_ms, quota rate per s, quota burst, archive length, webhook queue length,
#   how many shared keys the call ends with: SHARED_KEYS, or 0 when the deployment neither
#   archives nor queues webhooks (the keys would all be ''), and how many rooms' newest id the
#   library keeps from one call to the next (CHAT_REDIS_PUBLISH_ROOMS_KNOWN, see publish_frame),
#   then 1 when every send writes its room's newest id into the meta's `last`, 0 when a send
#   in a room with a log writes it only with the expiry's push (CHAT_REDIS_NEWEST_ID_IN_META).
#   The library reads them when the text differs from the last call's, which is rare: the
#   text is the same string in Redis' Lua from one call to the next (Lua keeps one copy of
#   each string, so comparing it is comparing two pointers).
# KEYS at the end (the shared keys, unless the header says 0): the archive stream (or ''
#   without a store), its count of messages not archived, the webhook queue (or ''), its count
#   of events not queued
# publish_frame(meta, log, dedup, channel, copy, conversation, head, body, claim) numbers,
# logs, archives and delivers one frame: meta, log (or '' for no history), dedup marker (or
# ''), channel, second channel (or ''), the conversation's name, the frame's head and body;
# -> id, 0, frame. With `claim`, the dedup marker is set to the id first, unless it exists:
# then nothing is published and it returns the first id, 1 (a duplicate). A message in the
# same room as the run's message before it (a busy room's sends, merged) does not read the
# room's meta again: the one before left it as it wrote it (`last`, when the expiry is due),
# and nothing else writes it within a call.
# Nor does a message in a room with a log that this library published in before, while that
# room's expiry is not due (its keys surely exist): the library keeps, from one call to the
# next, the `last` and due time it wrote in up to CHAT_REDIS_PUBLISH_ROOMS_KNOWN rooms (past
# that it starts over). What it keeps may be behind: a worker of another release (its own
# library) published there since; so may the meta's `last` (see INCARNATION). Then the log
# refuses the id (not above its newest entry), the meta is read after all (for what this
# library kept), and the message is numbered above the larger of its `last` and the log's
# newest entry. A meta that is gone (`HSET` adds `last` anew: the keys were deleted or
# evicted) starts a new incarnation just before the message. The library's memory is Redis'
# process's: a restarted server, a promoted replica or a library loaded again (each new
# connection loads it) starts empty.
# The log is trimmed exactly to its length: a room's log is short (a history), and trimming
# whole stream nodes instead (`MAXLEN ~`) would keep up to 100 entries more per room.
HEADER_ARGS: Final = 2


def publishing_header(
    log_length: int, ttl_ms: int, dedup_ttl_ms: int, rate: float, burst: int, archive_length: int,
    webhook_length: int, shared_keys: int, rooms_known: int, newest_id_in_meta: bool = False,
) -> str:  # fmt: skip
    """The settings part of the publishing scripts' header (see above), as the library reads it:
    whole numbers but the rate."""
    parts = (
        int(log_length), int(ttl_ms), int(dedup_ttl_ms), float(rate), int(burst),
        int(archive_length), int(webhook_length), int(shared_keys), int(rooms_known),
        int(newest_id_in_meta),
    )  # fmt: skip
    return " ".join(map(str, parts))


SHARED_KEYS: Final = 4
PUBLISH_FRAME: Final = """
local function next_id(last)  -- max(last + 1, now_id), as decimal texts: length, then text
  if #last > #now_id or (#last == #now_id and last >= now_id) then
    return string.format('%d', tonumber(last) + 1)
  end
  return now_id
end
local function is_due(due)  -- the keys' expiry is to be pushed back (decimal texts, as above)
  return due == nil or #due < #now_text or (#due == #now_text and due <= now_text)
end
local function forget_rooms()
  known_last, known_due, known_count = {}, {}, 0
end
local function begin_before(meta, log, id)  -- a new incarnation just before message `id`, with
  -- keys that expire from now; -> when their expiry is next due
  local added = entries_added(log)
  redis.call('HSET', meta, 'last', id, 'origin', string.format('%d', tonumber(id) - 1),
             'run', server_run(RUN), 'base', string.format('%d', added and added - 1 or -1))
  local field, due = push_expiry(meta, log, TTL)  -- the meta exists now
  redis.call('HSET', meta, field, due)
  return due
end
local function publish_frame(meta, log, dedup, channel, copy, conversation, head, body, claim)
  local last, due, known
  if meta == memo_meta then  -- the run's previous message was in this room: as it left it
    last, due = memo_last, memo_due
  else
    due = known_due[meta]
    if log ~= '' and not is_due(due) then
      last, known = known_last[meta], true
    else
      local _
      last, _, _, due = incarnation(meta, log, TTL, RUN, true)
    end
  end
  local id = next_id(last)
  if claim and dedup ~= '' then
    local first = redis.call('SET', dedup, id, 'NX', 'GET', 'PX', DEDUP_TTL)
    if first then return first, 1 end
  end
  -- The frame, as app.protocol.message_frame builds it from the same head and body.
  local payload = head .. id .. body .. now_text .. '}'
  local gone  -- the log was not there: see the end
  if log ~= '' then
    -- The entry <id>-0. `last` may be behind the log: what this library knew of the room (a
    -- worker of another release published in it since), or the meta's (see INCARNATION). The
    -- log then refuses the id, and the message is numbered above the log's newest entry.
    -- Without `last` on every send, a log that is gone must show here (see the end): unless
    -- the incarnation is new (no due time yet), where no log may be the room's first send.
    local added
    if WRITE_LAST or due == nil then
      added = redis.pcall('XADD', log, 'MAXLEN', LOG_LENGTH, id, 'f', payload)
    else
      added = redis.pcall('XADD', log, 'NOMKSTREAM', 'MAXLEN', LOG_LENGTH, id, 'f', payload)
      if not added then
        gone = true
        added = redis.pcall('XADD', log, 'MAXLEN', LOG_LENGTH, id, 'f', payload)
      end
    end
    if type(added) == 'table' and added.err then
      if not string.find(added.err, 'equal or smaller', 1, true) then error(added) end
      if known then
        known = nil
        local _
        last, _, _, due = incarnation(meta, log, TTL, RUN, true)
      end
      id = next_id(newest(log, last))
      if claim and dedup ~= '' then redis.call('SET', dedup, id, 'PX', DEDUP_TTL) end
      payload = head .. id .. body .. now_text .. '}'
      redis.call('XADD', log, 'MAXLEN', LOG_LENGTH, id, 'f', payload)
    end
  end
  -- The meta's `last`: written with the expiry's push, and on every send unless the room has
  -- a log and CHAT_REDIS_NEWEST_ID_IN_META is off (readers take the log's newest: INCARNATION).
  -- A log or a meta that was gone (the room's keys were deleted or evicted; without
  -- `last` on every send, only a log that was gone shows) starts a new incarnation just
  -- before this message, the one message after it the log is sure to hold.
  if gone then
    due = begin_before(meta, log, id)
  elseif is_due(due) then
    local field
    field, due = push_expiry(meta, log, TTL)
    redis.call('HSET', meta, 'last', id, field, due)
  elseif (WRITE_LAST or log == '') and redis.call('HSET', meta, 'last', id) == 1 and known then
    due = begin_before(meta, log, id)
  end
  memo_meta, memo_last, memo_due = meta, id, due
  if log ~= '' and ROOMS_KNOWN > 0 then
    if known_due[meta] == nil then
      if known_count >= ROOMS_KNOWN then forget_rooms() end
      known_count = known_count + 1
    end
    known_last[meta], known_due[meta] = id, due
  end
  if ARCHIVE ~= '' then
    if redis.call('XLEN', ARCHIVE) < ARCHIVE_MAX then
      redis.call('XADD', ARCHIVE, '*', 'c', conversation, 'f', payload)
    else  -- the backlog is full (the store has been down for long): counted, not archived,
      -- and the room's store history has a hole here that recovery must not read across
      redis.call('INCR', NOT_ARCHIVED)
      redis.call('HSET', meta, 'unarchived', id)
    end
  end
  -- Subscribers get the frame itself: workers of the previous release read it too (a rolling
  -- deploy runs both), and the broker reads the id from it (app.protocol.message_id_of).
  -- A room's channel (no second channel) is a shard channel on Redis Cluster (see sharded).
  redis.call(copy == '' and ROOM_PUBLISH or 'PUBLISH', channel, payload)
  if copy ~= '' and copy ~= channel then redis.call('PUBLISH', copy, payload) end
  if not claim and dedup ~= '' then redis.call('SET', dedup, id, 'PX', DEDUP_TTL) end
  return id, 0, payload
end
"""

# Messages, one or many (the publishing library's `publish`, below): the messages a worker
# publishes in one loop iteration go in one call (one run instead of one each:
# app.redisio.autopipeline merges them), in the order given, each as if alone.
# KEYS: per message: meta, log (or ''), dedup marker (or ''), the sender's message quota
#       bucket (or ''); then the shared keys (see above)
# ARGV: the header (see above), then per message: channel, head, body, second channel (or
#       ''), conversation
# With webhooks, the message is queued as `message.created` in the same step, unless the queue
# is full: then the count says so. One message's error (a key of the wrong type) is its own:
# the others go on (a Redis over its maxmemory refuses the whole call before it runs).
# -> {id, outcome, ts_ms} for each message, in one flat array: outcome 0 published,
# 1 duplicate (id: the first's), 2 refused by the quota, 4 failed (id: Redis' error).
MESSAGE_KEYS: Final = 4
PUBLISH: Final = """
local function publish_message(k, a)
  local bucket = KEYS[k + 4]
  if bucket ~= '' and take(bucket, RATE, BURST, now) == 0 then
    return 0, 2, 0
  end
  local conversation = ARGV[a + 5]
  local id, outcome, payload = publish_frame(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 1],
    ARGV[a + 4], conversation, ARGV[a + 2], ARGV[a + 3], true)
  if outcome == 1 then return id, 1, 0 end
  if WEBHOOKS ~= '' then
    if redis.call('XLEN', WEBHOOKS) < WEBHOOK_MAX then
      redis.call('XADD', WEBHOOKS, '*', 'e', 'message.created', 'c', conversation, 'f', payload)
    else
      redis.call('INCR', NOT_QUEUED)
    end
  end
  return id, 0, now
end
local function publish(keys, args)
  start(keys, args)
  local replies = {}
  for m = 0, (#KEYS - SHARED) / 4 - 1 do
    local ok, id, outcome, ts = pcall(publish_message, 4 * m, 2 + 5 * m)
    if not ok then id, outcome, ts = type(id) == 'table' and id.err or tostring(id), 4, 0 end
    replies[3 * m + 1], replies[3 * m + 2], replies[3 * m + 3] = id, outcome, ts
  end
  return replies
end
"""

# An event on message `target` (app.conversations.lifecycle): published like a message, and
# applied to the message's current state, a JSON object in the room's hash `state` (field: the
# message id). A duplicate (its dedup marker exists) answers {first id, 1, 0} before anything
# else, so a retried delete is a duplicate, not a refusal. Refused ({0, 3, 0}) when the
# message is deleted. A reaction toggles: its frame's body says `on` (ARGV[5]) when the user
# had not reacted with that emoji, else `off` (ARGV[12]). The state of a message the log no
# longer holds is ARGV[13], read from the store by the worker; kept in the hash from then on.
# The hash expires with the room and is pruned of the messages the log no longer holds when
# it grows past twice the log's length.
# KEYS: as one message of PUBLISH, then the state hash, then the shared keys (see above)
# ARGV: as one message of PUBLISH, then target id, kind (app.conversations.lifecycle.Kind: 1
#       edited, 2 deleted, 3 reaction), user, text (the new text, or the emoji), body of a
#       reaction taken back, the state known from the store (or '')
EVENT: Final = """
local function event(keys, args)
  start(keys, args)
  if KEYS[4] ~= '' and take(KEYS[4], RATE, BURST, now) == 0 then
    return {0, 2, 0}
  end
  if KEYS[3] ~= '' then
    local first = redis.call('GET', KEYS[3])
    if first then return {first, 1, 0} end
  end
  local target, kind, user, text = ARGV[8], tonumber(ARGV[9]), ARGV[10], ARGV[11]
  local raw = redis.call('HGET', KEYS[5], target)
  local state = {}
  if raw then
    state = cjson.decode(raw)
  elseif ARGV[13] ~= '' then
    state = cjson.decode(ARGV[13])
  end
  if state.deleted then return {0, 3, 0} end
  local body = ARGV[5]
  if kind == 1 then
    state.text = text
    state.edited = now
  elseif kind == 2 then
    state = {deleted = true}
  else
    local reactions = state.reactions or {}
    local kept, had = {}, false
    for _, u in ipairs(reactions[text] or {}) do
      if u == user then had = true else kept[#kept + 1] = u end
    end
    if had then body = ARGV[12] else kept[#kept + 1] = user end
    if #kept > 0 then reactions[text] = kept else reactions[text] = nil end
    if next(reactions) then state.reactions = reactions else state.reactions = nil end
  end
  local id = publish_frame(KEYS[1], KEYS[2], KEYS[3], ARGV[3], ARGV[6], ARGV[7], ARGV[4], body,
                           false)
  redis.call('HSET', KEYS[5], target, cjson.encode(state))
  redis.call('PEXPIRE', KEYS[5], math.ceil(tonumber(TTL) * 9 / 8))
  if KEYS[2] ~= '' and redis.call('HLEN', KEYS[5]) > 2 * tonumber(LOG_LENGTH) then
    local oldest = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
    if oldest then
      local floor = tonumber(string.sub(oldest[1], 1, -3))
      for _, field in ipairs(redis.call('HKEYS', KEYS[5])) do
        if tonumber(field) < floor then redis.call('HDEL', KEYS[5], field) end
      end
    end
  end
  return {id, 0, now}
end
"""

# The publishing library: PUBLISH and EVENT as Redis Functions (FUNCTION LOAD, Redis 7.0).
# Every EVALSHA runs a script's top level again, making each helper function and its upvalues
# anew (and collecting them after); a library's top level runs once, when it is loaded, and a
# call runs only its function. What a run shares (the keys and arguments, Redis' time, the
# header's values, the memos) lives in the library's upvalues, set by `start` at each call:
# Redis runs one call at a time. The library's name and its functions' carry a hash of its code,
# so that the workers of two releases (a rolling deploy) each call their own; the pipelines load
# it on every connection before its first call, as they load scripts (app.redisio.functions).
PUBLISHING_VARIABLES: Final = """
local KEYS, ARGV, RUN, ARCHIVE, NOT_ARCHIVED, WEBHOOKS, NOT_QUEUED, now_id
local memo_meta, memo_last, memo_due  -- the meta the run's last publish left, see publish_frame
-- what this library wrote last in rooms with a log, kept from one call to the next (see
-- publish_frame): meta -> `last`, meta -> when the expiry is due, how many rooms
local known_last, known_due, known_count = {}, {}, 0
local HEADER, LOG_LENGTH, TTL, DEDUP_TTL, RATE, BURST, ARCHIVE_MAX, WEBHOOK_MAX, SHARED
local ROOMS_KNOWN, WRITE_LAST
"""
START_RUN: Final = (
    """
local function read_header(header)
  local log_length, ttl, dedup_ttl, rate, burst, archive_max, webhook_max, shared, known,
    write_last = string.match(header,
      '^(%d+) (%d+) (%d+) (%S+) (%d+) (%d+) (%d+) (%d+) (%d+) ([01])$')
  if write_last == nil then error('hubbub: not a publishing header: ' .. header) end
  if log_length ~= LOG_LENGTH or ttl ~= TTL then forget_rooms() end
  LOG_LENGTH, TTL, DEDUP_TTL = log_length, ttl, dedup_ttl
  RATE, BURST = tonumber(rate), tonumber(burst)
  ARCHIVE_MAX, WEBHOOK_MAX, SHARED = tonumber(archive_max), tonumber(webhook_max), tonumber(shared)
  ROOMS_KNOWN, WRITE_LAST = tonumber(known), write_last == '1'
  if known_count > ROOMS_KNOWN then forget_rooms() end
  HEADER = header
end
local function start(keys, args)
  KEYS, ARGV = keys, args
  if redis_call == nil then bind_globals() end
  if ROOM_PUBLISH == 'SPUBLISH' then
    for i = 1, #KEYS do if string.sub(KEYS[i], -2) == ABSENT then KEYS[i] = '' end end
  end
"""
    + SET_NOW
    + """
  now_id = now_text .. '000'
  memo_meta = nil
  RUN = ARGV[1]
  if ARGV[2] ~= HEADER then read_header(ARGV[2]) end
  if SHARED == 0 then
    ARCHIVE, NOT_ARCHIVED, WEBHOOKS, NOT_QUEUED = '', '', '', ''
  else
    ARCHIVE, NOT_ARCHIVED = KEYS[#KEYS - 3], KEYS[#KEYS - 2]
    WEBHOOKS, NOT_QUEUED = KEYS[#KEYS - 1], KEYS[#KEYS]
  end
end
"""
)


# The library's functions reach Redis' and Lua's functions through upvalues rather than
# globals: a library's globals are a table of its own whose misses fall through a metatable
# to Lua's, so `string.format` is three table lookups where an upvalue is one step, and a
# publish makes about fifteen such calls a message. LIBRARY_LOCALS declares them and binds
# them at the library's first call (they are not there while it loads: see START_RUN), and
# the code's dotted names are rewritten to them.
LIBRARY_GLOBALS: Final = (
    "redis.call", "redis.pcall", "string.format", "string.byte", "string.sub", "string.match",
    "string.find", "math.floor", "math.ceil", "math.max", "cjson.encode", "cjson.decode",
    "tonumber", "tostring", "type", "pcall", "error", "ipairs",
)  # fmt: skip


def local_name(name: str) -> str:
    """The name of the local that LIBRARY_LOCALS binds to the global ``name``."""
    return name.replace(".", "_") if "." in name else f"lua_{name}"


LIBRARY_LOCALS: Final = (
    "local " + ", ".join(map(local_name, LIBRARY_GLOBALS)) + "\n"
    "local function bind_globals()\n"
    "  " + ", ".join(map(local_name, LIBRARY_GLOBALS)) + " =\n"
    "    " + ", ".join(LIBRARY_GLOBALS) + "\n"
    "end\n"
)  # fmt: skip


def with_library_locals(code: str) -> str:
    """``code`` with LIBRARY_LOCALS before it and its calls of those functions through them."""
    for name in LIBRARY_GLOBALS:
        code = re.sub(rf"(?<![\w.]){re.escape(name)}\(", f"{local_name(name)}(", code)
    return LIBRARY_LOCALS + code


def publishing_library(cluster: bool) -> tuple[RedisFunction, RedisFunction]:
    """The PUBLISH and EVENT functions of the publishing library, for one Redis or for Redis
    Cluster (see :func:`sharded`)."""
    body = with_library_locals(
        f"local ROOM_PUBLISH, ABSENT = '{'SPUBLISH' if cluster else 'PUBLISH'}', '{ABSENT}'\n"
        + NOW_VARIABLES + BUCKET_VARIABLES + PUBLISHING_VARIABLES
        + TAKE_FUNCTION + INCARNATION + EXPIRY + PUBLISH_FRAME + START_RUN + PUBLISH + EVENT
    )  # fmt: skip
    version = hashlib.sha256(body.encode()).hexdigest()[:16]
    library, publish, event = (f"hubbub_{part}{version}" for part in ("", "publish_", "event_"))
    code = (
        f"#!lua name={library}\n{body}"
        f"redis.register_function('{publish}', publish)\n"
        f"redis.register_function('{event}', event)\n"
    )
    return RedisFunction(library, publish, code), RedisFunction(library, event, code)


# One page of the replay after `since`: {1, more, id, frame, state, id, frame, state...} (state:
# the message's current state, see EVENT, or '') when every message
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
-- KEYS: meta, log, state   ARGV: run_id (see INCARNATION), since, page, cap, ttl_ms
local since = tonumber(ARGV[2])
local last, origin, base = incarnation(KEYS[1], KEYS[2], ARGV[5], ARGV[1])
last, origin, base = tonumber(last), tonumber(origin), tonumber(base)
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
    if archived >= upto and since >= hole then return {2, string.format('%d', upto)} end
    return {0, 0}
  end
end
local page, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local start = string.format('%d', since + 1) .. '-0'
local entries = redis.call('XRANGE', KEYS[2], start, '+', 'COUNT', cap + 1)
if #entries > cap then return {0, 0} end
local out = {1, #entries > page and 1 or 0}
local states = redis.call('EXISTS', KEYS[3]) == 1
for i = 1, math.min(page, #entries) do
  local id = string.sub(entries[i][1], 1, -3)  -- the message id: '<id>-0'
  out[#out + 1] = id
  out[#out + 1] = entries[i][2][2]
  out[#out + 1] = states and redis.call('HGET', KEYS[3], id) or ''
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
-- KEYS: meta, log   ARGV: run_id (see INCARNATION), ttl_ms
return (incarnation(KEYS[1], KEYS[2], ARGV[2], ARGV[1]))
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
