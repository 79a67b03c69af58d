"""Search indexing off the archiver's transaction: ``search_backlog``, the stored rows (new
messages, edits, deletions) the indexer has not applied to ``search_documents`` yet, in the
order they were stored.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "search_backlog",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.Identity(),
            nullable=False,
        ),
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_search_backlog"),
    )


def downgrade() -> None:
    op.drop_table("search_backlog")
