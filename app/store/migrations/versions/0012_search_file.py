"""SQLite: the search index leaves the store's file for a file of its own
(:mod:`app.store.search_file`, which makes it there and indexes what is stored once the
migrations are done). PostgreSQL: nothing changes.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import TSVECTOR

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
    op.create_table(
        "search_documents",
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("document", TSVECTOR().with_variant(sa.Text(), "sqlite"), nullable=True),
        sa.PrimaryKeyConstraint("conversation", "id", name="pk_search_documents"),
        schema="main",
    )
    op.create_index("ix_search_documents_ts_ms", "search_documents", ["ts_ms"], schema="main")
    op.create_index(
        "ix_search_documents_document",
        "search_documents",
        ["document"],
        schema="main",
        sqlite_where=sa.text("document IS NOT NULL"),
    )
    for statement in FTS_STATEMENTS:
        op.execute(statement.format(schema="main"))
    op.execute(INDEX_STORED.format(schema="main"))
