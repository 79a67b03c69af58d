"""The Redis clients a worker opens, configured one way: from ``CHAT_REDIS_URL``, with the
settings' timeouts, commands packed by hiredis (:func:`~app.redisio.redis_seam.
pack_with_hiredis`) and one retry on a fresh connection."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from app.redisio.redis_seam import pack_with_hiredis
from app.settings import Settings


def command_client(settings: Settings) -> Redis:
    """A client for commands and scripts: every call times out after ``redis_timeout_s``
    and is retried once, on a fresh connection (a pooled one may be stale after Redis
    restarted). The retry is redis-py's asyncio ``Retry``: the client awaits it (the sync one
    it used to be given never retried)."""
    assert settings.redis_url is not None
    return pack_with_hiredis(
        Redis.from_url(
            settings.redis_url,
            socket_timeout=settings.redis_timeout_s,
            socket_connect_timeout=settings.redis_timeout_s,
            retry=Retry(NoBackoff(), 1),
        )
    )


def subscriber_client(settings: Settings) -> Redis:
    """A client for the pub/sub subscription: no socket timeout (it blocks until a message
    comes; the broker's canary finds out when none can any more) and no retry."""
    assert settings.redis_url is not None
    return pack_with_hiredis(
        Redis.from_url(
            settings.redis_url,
            socket_connect_timeout=settings.redis_timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
    )
