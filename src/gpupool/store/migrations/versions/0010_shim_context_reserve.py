"""device context reserve: what one process holds beyond its slice, as the agent measured it

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 15:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("context_reserve_mib", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("devices", schema=None) as batch_op:
        batch_op.drop_column("context_reserve_mib")
