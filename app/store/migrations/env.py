"""Alembic's entry point for the store's migrations: always run by
:func:`app.store.database.migrate`, on the connection it passes (never from a URL here)."""

from __future__ import annotations

from alembic import context

from app.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
