"""notices outbox: ``--mail-type`` notices kept in the store until sent, so that a server
stopped or killed does not lose them and two replicas never both send one

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 22:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notices",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("recipient", sa.Text(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("due", sa.Float(), nullable=False),
        sa.Column("claimed_by", sa.String(length=200), nullable=True),
        sa.Column("claimed_until", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_notices_due", "notices", ["due"])


def downgrade() -> None:
    op.drop_index("ix_notices_due", table_name="notices")
    op.drop_table("notices")
