"""Messages and read state.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "messages",
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.Column("id", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("conversation", "id", name="pk_messages"),
    )
    op.create_index("ix_messages_ts_ms", "messages", ["ts_ms"])
    op.create_table(
        "read_state",
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.Column("last_read_id", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("user", "conversation", name="pk_read_state"),
    )


def downgrade() -> None:
    op.drop_table("read_state")
    op.drop_index("ix_messages_ts_ms", table_name="messages")
    op.drop_table("messages")
