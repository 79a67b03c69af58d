"""Mentions and notifications (issue 38): ``messages.mentions`` (the users a message mentions,
as its frame carries them), ``mentions`` (each user's mentions, for their list and unread
counts), ``notification_levels`` (each user's level and mute per conversation),
``notify_state`` (each user's pending notification per conversation, and when the last one
went) and ``push_subscriptions`` (Web Push endpoints).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("mentions", sa.Text(), nullable=True))
    op.create_table(
        "mentions",
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("user", "conversation", "id", name="pk_mentions"),
    )
    op.create_index("ix_mentions_user_ts_ms", "mentions", ["user", "ts_ms"])
    op.create_table(
        "notification_levels",
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("muted_until_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("user", "conversation", name="pk_notification_levels"),
    )
    op.create_index(
        "ix_notification_levels_conversation_level",
        "notification_levels",
        ["conversation", "level"],
    )
    op.create_table(
        "notify_state",
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.Column("pending_id", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.SmallInteger(), nullable=True),
        sa.Column("due_ms", sa.BigInteger(), nullable=True),
        sa.Column("pending_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("sent_ms", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("notified_id", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("user", "conversation", name="pk_notify_state"),
    )
    op.create_index("ix_notify_state_due_ms", "notify_state", ["due_ms"])
    op.create_table(
        "push_subscriptions",
        sa.Column("endpoint", sa.String(2048), nullable=False),
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("p256dh", sa.String(200), nullable=False),
        sa.Column("auth", sa.String(100), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("endpoint", name="pk_push_subscriptions"),
    )
    op.create_index("ix_push_subscriptions_user", "push_subscriptions", ["user"])


def downgrade() -> None:
    op.drop_table("push_subscriptions")
    op.drop_table("notify_state")
    op.drop_table("notification_levels")
    op.drop_table("mentions")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("mentions")
