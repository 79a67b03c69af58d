"""Access: who may connect and how much they may do.

Identity (:mod:`~app.access.auth`, :mod:`~app.access.guest`, token expiry of open sockets),
the Origin check, admission of a new socket, cross-server quotas and bans, per-connection rate
limits, caps on sockets still to authenticate, and the admin API's lockout.
"""
