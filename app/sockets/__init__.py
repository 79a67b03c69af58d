"""The life of a WebSocket: its session and frames (:mod:`app.sockets.session`), its
connection and outbox (:mod:`app.sockets.connection`), pipelined sends
(:mod:`app.sockets.send_window`), the worker's rooms and fan-out (:mod:`app.sockets.hub`),
catching up after a gap (:mod:`app.sockets.replay`), heartbeats and draining."""
