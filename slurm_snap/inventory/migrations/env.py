"""Alembic environment: the engine comes from slurm_snap.inventory.db, never from an ini file."""
from alembic import context

from slurm_snap.inventory.models import Base

engine = context.config.attributes["engine"]
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()
