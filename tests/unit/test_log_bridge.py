"""The standard library's logging, warnings and uncaught exceptions, as redacted events."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import threading
import warnings
from collections.abc import Iterator

import pytest

from aivedio import log_bridge, logs

KEY = "av_live_074ccae1_w7xWYJXs-4ddWXQAqDIaTaI0h8zXHLsE1VE5MaBIO44"
SECRET_PART = "w7xWYJXs-4dd"


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    logs.configure("info", "json", stream=out)
    try:
        yield out
    finally:
        logs.reset()


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_library_record_is_one_event_with_its_logger_and_text(stream: io.StringIO) -> None:
    logging.getLogger("aiohttp.client").warning("retrying %s with Bearer %s", "GET /x", KEY)
    (event,) = lines(stream)
    assert event["event"] == "stdlib_log"
    assert event["logger"] == "aiohttp.client"
    assert event["level"] == "warning"
    assert event["message"] == "retrying GET /x with Bearer ***"


def test_the_exception_text_of_a_record_is_redacted(stream: io.StringIO) -> None:
    try:
        raise ValueError(f"Invalid header value char:\n\n  b'Authorization: Bearer {KEY}\\x01'")
    except ValueError:
        logging.getLogger("aiohttp.server").exception("Error handling request from %s", "::1")
    (event,) = lines(stream)
    assert event["level"] == "error"
    assert "Traceback" in str(event["exception"])  # a real bug keeps its trace, redacted
    assert SECRET_PART not in stream.getvalue()


def test_records_below_the_level_are_dropped(stream: io.StringIO) -> None:
    logging.getLogger("asyncio").debug("Using selector: EpollSelector")
    logging.getLogger("asyncio").log(5, "below debug")
    assert stream.getvalue() == ""


def test_a_level_structlog_does_not_know_becomes_the_one_below(stream: io.StringIO) -> None:
    logging.getLogger("x").log(logging.WARNING + 5, "between warning and error")
    (event,) = lines(stream)
    assert event["level"] == "warning"


def test_asyncio_reports_a_lost_task_exception_through_the_pipeline(
    stream: io.StringIO,
) -> None:
    async def lose_one() -> None:
        async def boom() -> None:
            raise RuntimeError(f"provider answered for {KEY}")

        task = asyncio.get_running_loop().create_task(boom())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert task.done()
        del task  # never retrieved: asyncio logs it when the task is collected

    asyncio.run(lose_one())
    import gc

    gc.collect()
    (event,) = [e for e in lines(stream) if e.get("logger") == "asyncio"]
    assert str(event["message"]).startswith("Task exception was never retrieved")
    assert "RuntimeError" in str(event["exception"])
    assert SECRET_PART not in stream.getvalue()


def test_a_warning_is_an_event_not_a_line_on_stderr(
    stream: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(f"deprecated call with {KEY}", DeprecationWarning, stacklevel=1)
    (event,) = lines(stream)
    assert event["event"] == "python_warning"
    assert event["category"] == "DeprecationWarning"
    assert event["message"] == "deprecated call with av_***"
    assert event["lineno"]
    assert capsys.readouterr().err == ""


def test_an_exception_ending_a_thread_is_an_event(stream: io.StringIO) -> None:
    def run() -> None:
        raise OSError(f"connect failed: token={KEY}")

    thread = threading.Thread(target=run, name="uploader")
    thread.start()
    thread.join()
    (event,) = lines(stream)
    assert event["event"] == "thread_exception"
    assert (event["thread"], event["error_class"]) == ("uploader", "OSError")
    assert SECRET_PART not in stream.getvalue()


def test_an_exception_in_a_finalizer_is_an_event(stream: io.StringIO) -> None:
    class Leaky:
        def __del__(self) -> None:
            raise RuntimeError(f"closing with {KEY}")

    Leaky()
    (event,) = lines(stream)
    assert event["event"] == "unraisable_exception"
    assert event["error_class"] == "RuntimeError"
    assert SECRET_PART not in stream.getvalue()


def test_an_uncaught_exception_is_an_event(stream: io.StringIO) -> None:
    try:
        raise KeyError(KEY)
    except KeyError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    (event,) = lines(stream)
    assert (event["event"], event["level"]) == ("unhandled_exception", "critical")
    assert SECRET_PART not in stream.getvalue()


def test_configuring_twice_installs_one_handler_and_reset_puts_everything_back() -> None:
    before = (
        list(logging.getLogger().handlers),
        logging.getLogger().level,
        sys.excepthook,
        sys.unraisablehook,
        threading.excepthook,
        warnings.showwarning,
    )
    out = io.StringIO()
    logs.configure("info", "json", stream=out)
    logs.configure("warning", "json", stream=out)
    try:
        handlers = [
            h for h in logging.getLogger().handlers if isinstance(h, log_bridge.StructlogHandler)
        ]
        assert len(handlers) == 1
        assert logging.getLogger().level == logging.WARNING
        logging.getLogger("asyncio").info("not at warning level")
        assert out.getvalue() == ""
    finally:
        logs.reset()
    after = (
        list(logging.getLogger().handlers),
        logging.getLogger().level,
        sys.excepthook,
        sys.unraisablehook,
        threading.excepthook,
        warnings.showwarning,
    )
    assert after == before
