"""The fetch's store step: a server error while reading the stored output's asset is the
step's transient failure, as it was before the statement moved into the store."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest

from aivedio.errors import DatabaseError, TransientError
from aivedio.pipeline.fetch import _asset_of


class _Conn:
    def __init__(self, raised: BaseException | None = None, value: Any = None) -> None:
        self.raised, self.value = raised, value

    async def fetchval(self, *_args: Any) -> Any:
        if self.raised is not None:
            raise self.raised
        return self.value


@pytest.mark.anyio
async def test_a_server_error_is_the_store_steps_transient_failure() -> None:
    conn = _Conn(asyncpg.SerializationError("could not serialize access"))
    with pytest.raises(TransientError, match="recording the stored output failed") as caught:
        await _asset_of(conn, uuid.uuid4())  # type: ignore[arg-type]
    assert not isinstance(caught.value, DatabaseError)
    assert isinstance(caught.value.__cause__, asyncpg.SerializationError)


@pytest.mark.anyio
async def test_the_asset_is_returned() -> None:
    asset = uuid.uuid4()
    assert await _asset_of(_Conn(value=asset), uuid.uuid4()) == asset  # type: ignore[arg-type]
