"""The durable store: every message of every conversation (rooms and direct messages), and
what each user has read, in PostgreSQL (production) or SQLite (embedded, ``make run``).

Redis stays the hot path (fan-out and fast recovery); the store keeps the whole past.
:mod:`app.store.database` opens it and migrates its schema, :mod:`app.store.schema` is the
schema, :mod:`app.store.messages` reads and writes messages.
"""
