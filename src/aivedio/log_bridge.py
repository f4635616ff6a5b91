"""Everything a process would print on its own becomes a structlog event.

structlog only sees what our code logs. The rest reaches stderr by other ways, and each one
skipped the redaction: aiohttp's server logs a malformed request with the raw request line
in the exception's message (a live API key, a playback token), asyncio and uvloop log "Task
exception was never retrieved" and "Unclosed client session" through the ``asyncio``
logger, ``warnings`` writes to stderr, and an uncaught exception (in the main thread, in a
thread, in a ``__del__``) prints its traceback. ``install`` routes all of them into the
configured structlog pipeline, so every line of every process is one JSON event that went
through ``redact_processor``, exception text included.

A standard-library record keeps its logger name and its text (``message``), under the
event ``stdlib_log``; its exception, if any, is rendered by structlog like ours.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from types import TracebackType
from typing import Any, TextIO

import structlog

_STD_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)


def _structlog_level(levelno: int) -> int:
    """The standard level at or below ``levelno`` (structlog knows only those five)."""
    return max((level for level in _STD_LEVELS if level <= levelno), default=logging.DEBUG)


class StructlogHandler(logging.Handler):
    """Hands each standard-library record to structlog as a ``stdlib_log`` event."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {"logger": record.name, "message": record.getMessage()}
            if record.exc_info and record.exc_info[1] is not None:
                fields["exc_info"] = record.exc_info
            if record.stack_info:
                fields["stack"] = record.stack_info
            structlog.get_logger(record.name).log(
                _structlog_level(record.levelno), "stdlib_log", **fields
            )
        except Exception:  # a broken record must not break the code that logged it
            self.handleError(record)


def _showwarning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    if file is not None:  # written to a file the caller chose, as warnings would
        _saved["showwarning"](message, category, filename, lineno, file, line)
        return
    structlog.get_logger("py.warnings").warning(
        "python_warning",
        category=category.__name__,
        message=str(message),
        filename=filename,
        lineno=lineno,
    )


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    structlog.get_logger("aivedio").critical(
        "unhandled_exception", error_class=exc_type.__name__, exc_info=(exc_type, exc, tb)
    )


def _threading_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return  # what threading does: SystemExit ends a thread quietly
    structlog.get_logger("aivedio").error(
        "thread_exception",
        thread=args.thread.name if args.thread is not None else None,
        error_class=args.exc_type.__name__,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def _unraisablehook(unraisable: Any) -> None:
    try:
        obj = repr(unraisable.object)
    except Exception:
        obj = "<unrepresentable>"
    exc = unraisable.exc_value
    structlog.get_logger("aivedio").error(
        "unraisable_exception",
        message=unraisable.err_msg or "Exception ignored in",
        object=obj,
        error_class=unraisable.exc_type.__name__,
        exc_info=(unraisable.exc_type, exc, unraisable.exc_traceback) if exc else None,
    )


_saved: dict[str, Any] = {}
_handler = StructlogHandler()


def install(level: int) -> None:
    """Route the standard library's logging, warnings and uncaught exceptions into structlog.

    Idempotent; ``uninstall`` puts back what was there before the first call."""
    root = logging.getLogger()
    if not _saved:
        _saved.update(
            root_level=root.level,
            showwarning=warnings.showwarning,
            excepthook=sys.excepthook,
            threading_excepthook=threading.excepthook,
            unraisablehook=sys.unraisablehook,
        )
    if _handler not in root.handlers:
        root.addHandler(_handler)
    # Records below the level are not even built; structlog filters again by the same level.
    root.setLevel(level)
    warnings.showwarning = _showwarning
    sys.excepthook = _excepthook
    threading.excepthook = _threading_excepthook
    sys.unraisablehook = _unraisablehook


def uninstall() -> None:
    if not _saved:
        return
    root = logging.getLogger()
    root.removeHandler(_handler)
    root.setLevel(_saved["root_level"])
    warnings.showwarning = _saved["showwarning"]
    sys.excepthook = _saved["excepthook"]
    threading.excepthook = _saved["threading_excepthook"]
    sys.unraisablehook = _saved["unraisablehook"]
    _saved.clear()
