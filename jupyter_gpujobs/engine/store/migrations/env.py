"""Alembic environment for the jupyter-gpujobs store.

Migrations run from `Store.migrate()` with a live connection passed in `config.attributes`;
`alembic -x url=sqlite:///path upgrade head` also works for admins who prefer the CLI.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from jupyter_gpujobs.engine.store.tables import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    engine = create_engine(url)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
