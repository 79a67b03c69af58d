"""Redis I/O below redis-py's public API: the hot paths of the Redis broker and quotas.

:mod:`~app.redisio.redis_seam` is the only module that touches redis-py's internals (opening a
connection and taking its transport over; packing commands with hiredis);
:mod:`~app.redisio.autopipeline` (script calls of one loop iteration in one write) and
:mod:`~app.redisio.subscription` (a pub/sub connection parsed by hiredis) build on it.
"""
