"""containers: each node's engines, a pool's default engine and image registry allowlist

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 12:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("container_engines", sa.JSON(), nullable=False, server_default="[]")
        )
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.add_column(sa.Column("container_engine", sa.String(16), nullable=True))
        batch_op.add_column(
            sa.Column("image_registries", sa.JSON(), nullable=False, server_default="[]")
        )


def downgrade() -> None:
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.drop_column("image_registries")
        batch_op.drop_column("container_engine")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("container_engines")
