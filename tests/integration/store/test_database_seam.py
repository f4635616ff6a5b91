"""The seam's connection and transaction helpers: driver errors in taking a connection,
beginning, committing or rolling back are DatabaseErrors naming what was done; the
block's own errors are its own."""

from __future__ import annotations

import asyncpg
import pytest

from aivedio.errors import DatabaseError
from aivedio.store.database import Connection, Pool, acquired, transaction

pytestmark = pytest.mark.anyio

DEFERRED = """
CREATE TABLE seam_parent (id int PRIMARY KEY);
CREATE TABLE seam_child (
    parent int REFERENCES seam_parent (id) DEFERRABLE INITIALLY DEFERRED
);
"""


async def test_a_connection_is_taken_and_given_back(pool: Pool) -> None:
    before = pool.get_idle_size()
    async with acquired(pool) as conn:
        assert await conn.fetchval("SELECT 1") == 1
    assert pool.get_idle_size() >= before


async def _take(pool: Pool) -> None:
    async with acquired(pool, "reading the gates"):
        raise AssertionError("never reached")


async def test_a_closed_pool_is_a_database_error_naming_what_was_done(pool: Pool) -> None:
    await pool.close()
    with pytest.raises(DatabaseError, match="reading the gates") as caught:
        await _take(pool)
    assert isinstance(caught.value.__cause__, asyncpg.InterfaceError)


async def _fail_with_a_file_error(pool: Pool) -> None:
    async with acquired(pool) as conn, transaction(conn):
        raise FileNotFoundError("a file of the block, not the database")


async def test_the_blocks_own_errors_are_its_own(pool: Pool) -> None:
    with pytest.raises(FileNotFoundError):
        await _fail_with_a_file_error(pool)


async def _insert_then_fail(conn: Connection, n: int) -> None:
    async with transaction(conn):
        await conn.execute("INSERT INTO seam_rows VALUES ($1)", n)
        raise KeyError("undo")


async def test_a_transaction_commits_and_rolls_back(pool: Pool) -> None:
    await pool.execute("CREATE TABLE seam_rows (n int)")
    async with acquired(pool) as conn:
        async with transaction(conn):
            await conn.execute("INSERT INTO seam_rows VALUES (1)")
        with pytest.raises(KeyError):
            await _insert_then_fail(conn, 2)
        async with transaction(conn):
            await conn.execute("INSERT INTO seam_rows VALUES (3)")
            with pytest.raises(KeyError):
                await _insert_then_fail(conn, 4)  # a savepoint inside: undone alone
        assert not conn.is_in_transaction()
    assert [r["n"] for r in await pool.fetch("SELECT n FROM seam_rows ORDER BY n")] == [1, 3]


async def _insert_orphan(conn: Connection) -> None:
    async with transaction(conn, "the child's row"):
        await conn.execute("INSERT INTO seam_child VALUES (7)")  # checked at commit


async def test_a_commit_the_server_refuses_is_a_database_error(pool: Pool) -> None:
    await pool.execute(DEFERRED)
    async with acquired(pool) as conn:
        with pytest.raises(DatabaseError, match="committing the child's row") as caught:
            await _insert_orphan(conn)
        assert isinstance(caught.value.__cause__, asyncpg.ForeignKeyViolationError)
        assert not conn.is_in_transaction()
    assert await pool.fetchval("SELECT count(*) FROM seam_child") == 0
