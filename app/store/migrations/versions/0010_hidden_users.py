"""Block and mute (issue 41): ``hidden_users``, whom each user hides (muted), and of those
whom they block.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hidden_users",
        sa.Column("user", sa.String(100), nullable=False),
        sa.Column("target", sa.String(100), nullable=False),
        sa.Column("blocked", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("user", "target", name="pk_hidden_users"),
    )


def downgrade() -> None:
    op.drop_table("hidden_users")
