"""memory oversubscription: a pool's choice (fail or spill) and each slice's spilled bytes

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 00:55:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "memory_oversubscription", sa.String(8), nullable=False, server_default="fail"
            )
        )
    with op.batch_alter_table("slices", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("spilled_bytes", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("slices", schema=None) as batch_op:
        batch_op.drop_column("spilled_bytes")
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.drop_column("memory_oversubscription")
