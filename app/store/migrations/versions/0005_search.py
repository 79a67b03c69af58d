"""Search: ``search_documents`` (each message's text as it is now), with a GIN index over its
tsvector on PostgreSQL and an FTS5 index kept by triggers on SQLite; filled from the messages
already stored (their newest edit; deleted ones left out).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import TSVECTOR

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The messages stored so far, as they are now: the text of their newest edit, if any.
_BACKFILL = """
INSERT INTO search_documents (conversation, id, "user", ts_ms, text, version{document})
SELECT m.conversation, m.id, m."user", m.ts_ms, coalesce(e.text, m.text),
       coalesce(e.id, m.id){value}
FROM messages m
LEFT JOIN (
  SELECT conversation, target, max(id) AS id FROM messages WHERE kind = 1
  GROUP BY conversation, target
) newest ON newest.conversation = m.conversation AND newest.target = m.id
LEFT JOIN messages e ON e.conversation = newest.conversation AND e.id = newest.id
WHERE m.kind = 0 AND m.text <> ''
  AND NOT EXISTS (SELECT 1 FROM messages d
                  WHERE d.conversation = m.conversation AND d.target = m.id AND d.kind = 2)
"""

# SQLite: an FTS5 index over search_documents (external content: the text is not kept twice),
# in step with it through triggers. unicode61 folds case and diacritics.
_SQLITE_FTS = [
    "CREATE VIRTUAL TABLE search_fts USING fts5(text, content='search_documents', "
    "content_rowid='rowid', tokenize='unicode61 remove_diacritics 2')",
    "CREATE TRIGGER search_documents_ai AFTER INSERT ON search_documents BEGIN "
    "INSERT INTO search_fts(rowid, text) VALUES (new.rowid, new.text); END",
    "CREATE TRIGGER search_documents_ad AFTER DELETE ON search_documents BEGIN "
    "INSERT INTO search_fts(search_fts, rowid, text) VALUES ('delete', old.rowid, old.text); END",
    "CREATE TRIGGER search_documents_au AFTER UPDATE OF text ON search_documents BEGIN "
    "INSERT INTO search_fts(search_fts, rowid, text) VALUES ('delete', old.rowid, old.text); "
    "INSERT INTO search_fts(rowid, text) VALUES (new.rowid, new.text); END",
]


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
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
    )
    op.create_index("ix_search_documents_ts_ms", "search_documents", ["ts_ms"])
    op.create_index(
        "ix_search_documents_document",
        "search_documents",
        ["document"],
        postgresql_using="gin",
        sqlite_where=sa.text("document IS NOT NULL"),
    )
    if postgres:
        # The language of what was stored before is not known here: 'simple' (no stemming),
        # what CHAT_SEARCH_LANGUAGE defaults to.
        op.execute(
            _BACKFILL.format(
                document=", document", value=", to_tsvector('simple', coalesce(e.text, m.text))"
            )
        )
    else:
        for statement in _SQLITE_FTS:
            op.execute(statement)
        op.execute(_BACKFILL.format(document="", value=""))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        for trigger in ("search_documents_ai", "search_documents_ad", "search_documents_au"):
            op.execute(f"DROP TRIGGER {trigger}")
        op.execute("DROP TABLE search_fts")
    op.drop_index("ix_search_documents_document", "search_documents")
    op.drop_index("ix_search_documents_ts_ms", "search_documents")
    op.drop_table("search_documents")
