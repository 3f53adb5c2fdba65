"""Operations the workflows' migrations share (a module the migration loader skips: its name
starts with ``_``)."""

from django.db import migrations


def drop_index_concurrently(table: str, index: str, column: str) -> migrations.RunSQL:
    """Drop the index Django made for a column of ``table`` (``db_index``), without taking the
    lock that blocks writes (so in a migration that is not ``atomic``); reversed, it is built
    again the same way."""
    return migrations.RunSQL(f'DROP INDEX CONCURRENTLY IF EXISTS "{index}"',
                             reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{index}" ON "{table}" ("{column}")')
