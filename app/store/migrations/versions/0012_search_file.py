"""SQLite: the search index leaves the store's file for a file of its own
(:mod:`app.store.search_file`, which makes it there and indexes what is stored once the
migrations are done). PostgreSQL: nothing changes.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from app.store.schema import search_documents
from app.store.search_file import FTS_STATEMENTS, INDEX_STORED

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_TRIGGERS = ("search_documents_ai", "search_documents_ad", "search_documents_au")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        return
    for trigger in _TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS main.{trigger}")
    op.execute("DROP TABLE IF EXISTS main.search_fts")
    op.execute("DROP INDEX IF EXISTS main.ix_search_documents_document")
    op.execute("DROP INDEX IF EXISTS main.ix_search_documents_ts_ms")
    op.execute("DROP TABLE IF EXISTS main.search_documents")


def downgrade() -> None:
    """Back in the store's file (as 0005 made it), indexed from what is stored; the search
    file is left as it is (a version before 0012 does not open it)."""
    if op.get_bind().dialect.name == "postgresql":
        return
    # As 0005 made it (schema.py describes it still), with its indexes.
    search_documents.to_metadata(sa.MetaData(), schema="main").create(op.get_bind())
    for statement in FTS_STATEMENTS:
        op.execute(statement.format(schema="main"))
    op.execute(INDEX_STORED.format(schema="main"))
