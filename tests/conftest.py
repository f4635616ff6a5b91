"""Test rig: real PostgreSQL, one migrated template database cloned per test.

``AIVEDIO_TEST_DSN`` names the server (scripts/test sets it, starting a throwaway cluster
when none answers); the default is the local one on 127.0.0.1:5432.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import msgspec
import pytest

from aivedio import log_bridge
from aivedio.config.load import Config, LaneConfig, load_config
from aivedio.store import migrations
from aivedio.store.database import Pool, open_pool

# Fixtures shared by the S3 tests: each engine, and the engine parametrized over both.
from tests.support.s3_server import moto_endpoint, s3_endpoint  # noqa: F401
from tests.support.seaweedfs import seaweedfs_endpoint  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
TEST_KEY = base64.b64encode(b"k" * 32).decode()
SERVER_DSN = os.environ.get("AIVEDIO_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


INTEGRATION_ROOTS = ("integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration and tests/e2e carries the integration marker (it
    needs real PostgreSQL, processes or servers), by where it lives, so none can forget it:
    ``-m "not integration"`` runs the unit tests alone."""
    for item in items:
        parts = item.path.relative_to(ROOT).parts
        if len(parts) > 1 and parts[0] == "tests" and parts[1] in INTEGRATION_ROOTS:
            item.add_marker(pytest.mark.integration)


def dsn_for(database: str) -> str:
    parts = urlsplit(SERVER_DSN)
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(autouse=True)
def _stdlib_logging_put_back() -> Iterator[None]:
    """``cli.main`` routes the process's logging, warnings and exception hooks into structlog
    (``log_bridge``); a test that runs it in-process leaves none of that to the next test."""
    yield
    log_bridge.uninstall()


@pytest.fixture(scope="session")
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": True})


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(SERVER_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


class _Databases:
    """Fresh clones of the template, one per test, each made while the test before runs.

    Cloning the migrated template and dropping a used database each take a good part of a
    second on a busy machine (a drop waits for a checkpoint), so one thread does both beside
    the tests: it clones the next test's database while a test runs, and drops a finished
    test's database while the next one runs, so a test seldom waits for either. Each test
    still gets a database of its own, cloned from the template, never used before, and
    dropped after it (its connections ended by FORCE, whatever of the test still holds
    one); a drop that fails fails the session's end, naming the database."""

    def __init__(self, template: str) -> None:
        self.template = template
        self._maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clone-db")
        self._next = self._maker.submit(self._clone)
        self._drops: list[Future[None]] = []

    def _clone(self) -> str:
        import asyncio

        name = f"aivedio_t_{uuid.uuid4().hex[:12]}"
        asyncio.run(_admin(f"CREATE DATABASE {name} TEMPLATE {self.template}"))
        return name

    @staticmethod
    def _drop(name: str) -> None:
        import asyncio

        asyncio.run(_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))

    def take(self) -> str:
        name = self._next.result()
        self._next = self._maker.submit(self._clone)
        return name

    def give_back(self, name: str) -> None:
        """Drop ``name`` beside the next test (before the clone after that one)."""
        self._drops = [d for d in self._drops if not d.done() or d.exception() is not None]
        self._drops.append(self._maker.submit(self._drop, name))

    def settle(self) -> None:
        """Wait until the thread has nothing left to do (the next clone made, every drop
        done): it opens and closes sockets meanwhile, which a test counting this process's
        file descriptors would take for its own."""
        self._next.result()
        for drop in self._drops:
            drop.result()

    def close(self) -> None:
        try:
            spare = self._next.result()
            self._drops.append(self._maker.submit(self._drop, spare))
        finally:
            self._maker.shutdown(wait=True)
        for drop in self._drops:
            drop.result()  # a database left behind is this session's failure, said here


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    import asyncio

    name = f"aivedio_tmpl_{os.getpid()}"

    async def create() -> None:
        await _admin(f"DROP DATABASE IF EXISTS {name}")
        await _admin(f"CREATE DATABASE {name}")
        conn = await asyncpg.connect(dsn_for(name))
        try:
            await migrations.migrate(conn)
        finally:
            await conn.close()

    asyncio.run(create())
    yield name
    asyncio.run(_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


_SESSION_DATABASES: list[_Databases] = []  # this worker's, once a test asked for one


@pytest.fixture(scope="session")
def _databases(template_db: str) -> Iterator[_Databases]:
    databases = _Databases(template_db)
    _SESSION_DATABASES.append(databases)
    yield databases
    _SESSION_DATABASES.remove(databases)
    databases.close()


@pytest.fixture
def settled_databases() -> None:
    """The databases' thread idle (``_Databases.settle``), for tests that compare this
    process's open file descriptors before and after; a no-op where no test used one."""
    for databases in _SESSION_DATABASES:
        databases.settle()


@pytest.fixture
def database(_databases: _Databases) -> Iterator[str]:
    """A fresh, migrated database for one test: its DSN."""
    name = _databases.take()
    yield dsn_for(name)
    _databases.give_back(name)


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database with no schema at all, for migration tests."""
    import asyncio

    name = f"aivedio_e_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f"CREATE DATABASE {name}"))
    yield dsn_for(name)
    asyncio.run(_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def make_config(dsn: str, **worker: object) -> Config:
    base = load_config(
        environ={"AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY, "AIVEDIO_DATABASE_URL": dsn}
    )
    lanes = {
        "control": LaneConfig(slots=16),
        "fetch": LaneConfig(slots=4),
        "media": LaneConfig(slots=2),
    }
    settings: dict[str, object] = {"lanes": lanes, "http_port": 0, "poll_interval_seconds": 0.2}
    settings.update(worker)
    return msgspec.structs.replace(base, worker=msgspec.structs.replace(base.worker, **settings))


@pytest.fixture
def config(database: str) -> Config:
    return make_config(database)


@pytest.fixture
async def pool(config: Config) -> AsyncIterator[Pool]:
    async with open_pool(config.database, min_size=1, max_size=8) as p:
        yield p
