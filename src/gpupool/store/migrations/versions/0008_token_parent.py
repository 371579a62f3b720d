"""tokens.parent_id: the token that minted a token (revoking it revokes what it minted)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parent_id", sa.String(length=32), nullable=True))
        batch_op.create_index("ix_tokens_parent_id", ["parent_id"])


def downgrade() -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_index("ix_tokens_parent_id")
        batch_op.drop_column("parent_id")
