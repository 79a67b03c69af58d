"""Participants: the conversations each user takes part in (their inbox).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "participants",
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("user", "conversation", name="pk_participants"),
    )


def downgrade() -> None:
    op.drop_table("participants")
