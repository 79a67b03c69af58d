"""``search_backlog.kind``: what each queued row is (new message, edit, deletion), written by
the archiver as it queues the row, so the indexer finds the few edits and deletions of a batch
without joining every queued row to ``messages`` (issue 37: indexing cost archiving ~10 %
more than it needs to). Rows queued before this migration take their kind from ``messages``.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_BACKFILL = """
UPDATE search_backlog SET kind = coalesce((
  SELECT m.kind FROM messages m
  WHERE m.conversation = search_backlog.conversation AND m.id = search_backlog.id
), 0)
"""


def upgrade() -> None:
    with op.batch_alter_table("search_backlog") as batch:
        batch.add_column(
            sa.Column("kind", sa.SmallInteger(), nullable=False, server_default=sa.text("0"))
        )
    op.execute(_BACKFILL)


def downgrade() -> None:
    with op.batch_alter_table("search_backlog") as batch:
        batch.drop_column("kind")
