"""Files: ``files`` (one row per upload: who, where, what, and the message it is attached to)
and ``messages.attachments`` (a message's files as its frame carries them).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("attachments", sa.Text(), nullable=True))
    op.create_table(
        "files",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("conversation", sa.String(200), nullable=False),
        sa.Column("uploader", sa.String(100), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("content_type", sa.String(100), nullable=False, server_default=""),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.Column("thumbnail", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("state", sa.SmallInteger(), nullable=False),
        sa.Column("message_id", sa.BigInteger(), nullable=True),
        sa.Column("cid", sa.String(80), nullable=True),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_files"),
    )
    op.create_index("ix_files_state_created_ms", "files", ["state", "created_ms"])
    op.create_index("ix_files_conversation_message_id", "files", ["conversation", "message_id"])
    op.create_index("ix_files_uploader", "files", ["uploader"])


def downgrade() -> None:
    op.drop_index("ix_files_uploader", "files")
    op.drop_index("ix_files_conversation_message_id", "files")
    op.drop_index("ix_files_state_created_ms", "files")
    op.drop_table("files")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("attachments")
