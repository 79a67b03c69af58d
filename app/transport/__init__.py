"""Transport: getting frames onto sockets.

Bounded per-socket outboxes (:mod:`~app.transport.outbox`) under a worker-wide budget
(:mod:`~app.transport.budget`), written once per loop iteration by the
:mod:`~app.transport.flusher`, without a task per write (:mod:`~app.transport.eager`), as
frames encoded once per flush (:mod:`~app.transport.frames`).

:mod:`~app.transport.uvicorn_seam` is the only module that touches uvicorn's, uvicorn-worker's
and websockets' internals (direct writes, aborting a stuck socket, the draining server and
worker); nothing else here or elsewhere does.
"""
