"""Rooms (public or private, with a title and a topic) and their members' roles; an index of
read positions by conversation.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rooms",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("private", sa.Boolean(), nullable=False),
        sa.Column("title", sa.String(200), nullable=False, server_default=""),
        sa.Column("topic", sa.Text(), nullable=False, server_default=""),
        sa.Column("created_by", sa.String(100), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_rooms"),
    )
    op.create_table(
        "members",
        sa.Column("room", sa.String(64), nullable=False),
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("role", sa.String(10), nullable=False),
        sa.Column("added_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("room", "user", name="pk_members"),
    )
    op.create_index("ix_members_user", "members", ["user"])
    # `receipts` after every join read a room's readers: not a scan of every read position.
    op.create_index(
        "ix_read_state_conversation_last_read_id", "read_state", ["conversation", "last_read_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_read_state_conversation_last_read_id", "read_state")
    op.drop_index("ix_members_user", "members")
    op.drop_table("members")
    op.drop_table("rooms")
