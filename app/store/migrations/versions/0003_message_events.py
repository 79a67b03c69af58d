"""Message events: edits, deletions and reactions are rows of the log, beside messages.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("kind", sa.SmallInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("target", sa.BigInteger(), nullable=True))
    # Partial: most rows (messages that answer nothing) stay out of it.
    op.create_index(
        "ix_messages_conversation_target",
        "messages",
        ["conversation", "target"],
        postgresql_where=sa.text("target IS NOT NULL"),
        sqlite_where=sa.text("target IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_messages_conversation_target", "messages")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("target")
        batch.drop_column("kind")
