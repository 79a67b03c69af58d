"""File descriptors: every open socket is one, and a worker that runs out of them loses
connections without a word.

At the descriptor limit, ``accept`` fails with EMFILE and libuv (uvloop) accepts and closes
the pending connections to keep its loop from spinning: clients see a reset, and a sibling
worker with room to spare never gets them. So the worker caps its connections below the
limit (:func:`connection_cap`): an upgrade beyond the cap is accepted and closed with 1013
(try again later), which clients retry, while the headroom serves upgrades in flight, Redis
and the log.
"""

from __future__ import annotations

import logging
import resource
from typing import Final

logger = logging.getLogger(__name__)

# Descriptors kept free of WebSockets: upgrades in flight (each holds one until its hello or
# its 1013), Redis connections, the listening sockets, logs and metrics files.
MIN_HEADROOM: Final = 64
HEADROOM_SHARE: Final = 0.05


def raise_soft_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit; return the soft limit.
    (The soft limit is often 1,024 while the hard one allows far more.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and hard != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # e.g. hard is RLIM_INFINITY beyond nr_open
            logger.warning("cannot raise the descriptor limit from %d: %s", soft, exc)
    return soft


def connection_cap(max_connections: int, descriptor_limit: int) -> int:
    """How many WebSockets one worker may hold: ``max_connections`` (CHAT_MAX_CONNECTIONS),
    or fewer when the descriptor limit leaves no headroom for it (logged, once per worker)."""
    if descriptor_limit == resource.RLIM_INFINITY:
        return max_connections
    headroom = max(MIN_HEADROOM, int(descriptor_limit * HEADROOM_SHARE))
    allowed = max(1, descriptor_limit - headroom)
    if max_connections <= allowed:
        return max_connections
    logger.warning(
        "CHAT_MAX_CONNECTIONS=%d does not fit the descriptor limit (%d, 'ulimit -n'): this "
        "worker holds at most %d WebSockets and closes further upgrades with 1013; raise the "
        "limit (deploy/limits.d, LimitNOFILE, docker ulimits) or run more workers",
        max_connections,
        descriptor_limit,
        allowed,
    )
    return allowed
