"""The PostgreSQL seam: opening pools and connections, and translating asyncpg's errors.

Every session sets ``statement_timeout`` and ``idle_in_transaction_session_timeout`` so that a
stuck query or a forgotten transaction cannot hold locks on the job queue forever.
asyncpg's exceptions never leave this package: ``map_db_errors`` turns them into
``DatabaseError`` (retryable) at the edge.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import anyio
import asyncpg
import msgspec

from aivedio.config.load import DatabaseConfig
from aivedio.errors import DatabaseError, InvalidValueError
from aivedio.logs import get_logger
from aivedio.scheduling import backoff_seconds
from aivedio.store import timestamps

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Pool: TypeAlias = asyncpg.Pool[asyncpg.Record]
    # A connection of our own or one borrowed from a pool: both answer the same verbs.
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
else:
    Pool = asyncpg.Pool
    Connection = asyncpg.Connection

T = TypeVar("T")
log = get_logger("aivedio.database")


def _server_settings(config: DatabaseConfig) -> dict[str, str]:
    return {
        "statement_timeout": str(int(config.statement_timeout_seconds * 1000)),
        "idle_in_transaction_session_timeout": str(
            int(config.idle_in_transaction_timeout_seconds * 1000)
        ),
        "application_name": "aivedio",
    }


async def _init_connection(conn: Connection) -> None:
    # jsonb in and out as Python objects, through msgspec (fast, strict).
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: msgspec.json.encode(v).decode(),
        decoder=msgspec.json.decode,
        schema="pg_catalog",
    )
    # Always aware, never an overflow: asyncpg's own codec makes ±infinity naive (timestamps.py).
    await conn.set_type_codec(
        "timestamptz",
        encoder=timestamps.encode,
        decoder=timestamps.decode,
        schema="pg_catalog",
        format="tuple",
    )


# What the driver and the sockets under it raise: DatabaseError at the seam.
DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # What a pooled connection raises after the server restarted under it ("cannot switch
    # to state …; another operation is in progress"): not an InterfaceError, and as
    # transient as one.
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


def database_error(action: str, exc: BaseException) -> DatabaseError:
    """``exc`` (one of DRIVER_ERRORS) as the DatabaseError to raise ``from`` it: an
    InvalidValueError when a value was refused (SQLSTATE class 22, a data exception, or
    23514, a CHECK constraint, or a value the driver cannot encode), which is the input's
    fault and no outage."""
    if _refused_value(exc):
        # The server's message alone: its DETAIL ("Failing row contains (…)") is the whole
        # row, which is not the client's to read (the detail of a 400 goes back to it).
        message = getattr(exc, "message", None) or str(exc).partition("\n")[0]
        return InvalidValueError(f"{action}: {type(exc).__name__}: {message}")
    error = DatabaseError(f"{action}: {type(exc).__name__}: {exc}")
    error.server_gone = server_went_away(exc)
    return error


def _refused_value(exc: BaseException) -> bool:
    # asyncpg's own DataError: an argument it cannot encode (an integer past 64 bits).
    if isinstance(exc, asyncpg.DataError):
        return True
    state = str(getattr(exc, "sqlstate", "") or "")
    return state.startswith("22") or state == "23514"


@contextmanager
def map_db_errors(action: str) -> Iterator[None]:
    """Translate driver and socket errors into DatabaseError, naming what we were doing."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise database_error(action, exc) from exc


async def until_database_answers(
    step: Callable[[], Awaitable[T]], what: str, *, within_seconds: float = 30.0
) -> T:
    """Run a start-up ``step``, again (with jittered backoff) while the database is
    unreachable, as during a restart or a failover, for up to ``within_seconds``; then its
    DatabaseError stands (a clean exit for the supervisor to restart)."""
    deadline = time.monotonic() + within_seconds
    attempt = 0
    while True:
        try:
            return await step()
        except DatabaseError as exc:
            if not _unreachable(exc):
                raise  # a refusal (permissions, a missing table) that waiting will not fix
            attempt += 1
            delay = backoff_seconds(attempt, 0.2, 2.0)
            if time.monotonic() + delay > deadline:
                raise
            log.warning(
                "database_unavailable_retrying",
                step=what,
                attempt=attempt,
                delay_seconds=round(delay, 3),
                error=exc.detail,
            )
            await anyio.sleep(delay)


def _unreachable(exc: DatabaseError) -> bool:
    """The server is not there (yet): a refused or reset connection, a timeout, a server
    starting up or shutting down (SQLSTATE 57P01-57P03), a connection failure (class 08)."""
    cause = exc.__cause__
    if isinstance(cause, OSError | TimeoutError | asyncpg.InterfaceError):
        return True
    return _server_gone(cause)


def _server_gone(exc: BaseException | None) -> bool:
    """The server's own word that it is going or gone: SQLSTATE class 08 (connection
    exception), 57P01-57P03 (shutting down, crashed, starting up)."""
    state = str(getattr(exc, "sqlstate", "") or "")
    return state.startswith("08") or state in ("57P01", "57P02", "57P03")


# What asyncpg says, in an error of its own type, when the connection under a call is gone
# (the exact class only: its subclasses are programming errors, e.g. DataError).
_GONE_MESSAGES = {
    asyncpg.InterfaceError: ("connection is closed",),
    # A pooled connection the restart left mid-protocol (chaos finding 1).
    asyncpg.InternalClientError: ("cannot switch to state",),
}


def server_went_away(exc: BaseException) -> bool:
    """Whether a driver error says the server went away (``lost_server``'s rule, which
    ``database_error`` records as ``DatabaseError.server_gone`` for the row guards)."""
    gone = isinstance(exc, ConnectionError) or any(
        phrase in str(exc) for phrase in _GONE_MESSAGES.get(type(exc), ())
    )
    return gone or (isinstance(exc, asyncpg.PostgresError) and _server_gone(exc))


def lost_server(exc: BaseException) -> DatabaseError | None:
    """A driver error that escaped ``map_db_errors`` (a stage's own ``pool.acquire()`` or
    query while the server restarted under it) as the DatabaseError it is, when it says the
    server went away: a refused, reset or aborted connection, asyncpg's own "connection is
    closed" or stale-protocol error, SQLSTATE class 08 or 57P01-57P03. Anything else, None:
    a bug stays a crash with its traceback (an argument asyncpg cannot encode, a wrong
    argument count, an OSError of a file, a timeout of anything)."""
    if not server_went_away(exc):
        return None
    error = database_error("the server went away", exc)
    error.__cause__ = exc  # as map_db_errors' ``raise … from``
    return error


async def _keep_session(_conn: Connection) -> None:
    """What a pooled connection needs on release beyond asyncpg's own rollback of an open
    transaction (which runs before this): nothing. Session state of ours (LISTEN, session
    advisory locks) lives only on dedicated connections (``open_connection``), and nothing
    SETs a session variable, so asyncpg's default reset query (unlock all, UNLISTEN, RESET
    ALL, CLOSE ALL) would cost a round trip on every pool call for nothing: 45% of all round
    trips in the fleet benchmark."""


@asynccontextmanager
async def open_pool(
    config: DatabaseConfig,
    *,
    min_size: int | None = None,
    max_size: int | None = None,
    wait_seconds: float = 0.0,
) -> AsyncIterator[Pool]:
    """A pool; ``wait_seconds``: wait that long for a database that is not there yet
    (``until_database_answers``), as a daemon's start-up does."""

    async def create() -> Pool:
        with map_db_errors("connecting to PostgreSQL"):
            return await _create_pool(config, min_size, max_size)

    if wait_seconds > 0:
        pool = await until_database_answers(
            create, "connecting to PostgreSQL", within_seconds=wait_seconds
        )
    else:
        pool = await create()
    try:
        yield pool
    finally:
        await pool.close()


async def _create_pool(config: DatabaseConfig, min_size: int | None, max_size: int | None) -> Pool:
    pool: Pool = await asyncpg.create_pool(
        config.url,
        min_size=config.pool_min_size if min_size is None else min_size,
        max_size=config.pool_max_size if max_size is None else max_size,
        server_settings=_server_settings(config),
        init=_init_connection,
        reset=_keep_session,
        timeout=config.connect_timeout_seconds,
    )
    return pool


async def connect(config: DatabaseConfig, *, codecs: bool = True) -> Connection:
    """A connection of its own, the caller's to close. ``codecs=False`` skips the jsonb
    codec, whose set-up reads the type from the catalogue (a round trip): for a connection
    that only holds locks."""
    with map_db_errors("connecting to PostgreSQL"):
        conn: Connection = await asyncpg.connect(
            config.url,
            server_settings=_server_settings(config),
            timeout=config.connect_timeout_seconds,
        )
        try:
            if codecs:
                await _init_connection(conn)
        except BaseException:  # cancelled or failed half-way: the connection is still ours
            conn.terminate()
            raise
    return conn


@asynccontextmanager
async def open_connection(
    config: DatabaseConfig, *, codecs: bool = True
) -> AsyncIterator[Connection]:
    """``connect``, closed on exit."""
    conn = await connect(config, codecs=codecs)
    try:
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def acquired(
    pool: Pool, doing: str = "taking a database connection"
) -> AsyncIterator[Connection]:
    """A pooled connection for the block, given back after it. A driver error in taking or
    giving it back is a DatabaseError naming ``doing``; the block's own errors are its own
    (an OSError of a file in the block stays an OSError)."""
    with map_db_errors(doing):
        conn = await pool.acquire()
    try:
        yield conn
    finally:
        with map_db_errors(doing):
            await pool.release(conn)


@asynccontextmanager
async def transaction(conn: Connection, doing: str = "a transaction") -> AsyncIterator[None]:
    """``conn.transaction()`` whose begin, commit and rollback map driver errors to a
    DatabaseError naming ``doing``; the block's own errors are its own. Nested in another
    transaction, it is a savepoint, as asyncpg's."""
    tx = conn.transaction()
    with map_db_errors(f"beginning {doing}"):
        await tx.start()
    try:
        yield
    except BaseException:
        with map_db_errors(f"rolling back {doing}"):
            await tx.rollback()
        raise
    with map_db_errors(f"committing {doing}"):
        await tx.commit()


def row_dict(record: Any) -> dict[str, Any]:
    return dict(record.items())
