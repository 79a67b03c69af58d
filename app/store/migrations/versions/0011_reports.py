"""Reports of messages (issue 41): ``reports``, the moderators' queue.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reports",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.Identity(),
            nullable=False,
        ),
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.Column("message_id", sa.BigInteger(), nullable=False),
        sa.Column("author", sa.String(100), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("reporter", sa.String(100), nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("resolved_ms", sa.BigInteger(), nullable=True),
        sa.Column("resolved_by", sa.String(100), nullable=True),
        sa.Column("outcome", sa.String(20), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_reports"),
    )
    op.create_index(
        "ix_reports_reporter_conversation_message_id",
        "reports",
        ["reporter", "conversation", "message_id"],
        unique=True,
    )
    op.create_index("ix_reports_resolved_ms_id", "reports", ["resolved_ms", "id"])


def downgrade() -> None:
    op.drop_table("reports")
