"""Errors as JSON, in one shape: ``{"error": {"code": ..., "detail": ...}}``.

The one mapping from the error taxonomy (``aivedio.errors``) to HTTP statuses lives here;
handlers raise, the middleware answers. An unexpected exception is logged with its trace and
answered 500 without detail (never a stack trace, never a secret, to a client).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from aivedio.api.tokens import TokenRejected
from aivedio.errors import (
    AivedioError,
    ConfigError,
    DatabaseError,
    InvalidValueError,
    MalformedInputError,
    NotFoundError,
    PolicyBlockedError,
    StaleStateError,
    TooLargeError,
    TransientError,
)
from aivedio.logs import get_logger, redact_text

log = get_logger("aivedio.api")

# The first match wins, so subclasses come before their bases.
STATUS_OF: list[tuple[type[AivedioError], int]] = [
    (TokenRejected, 403),
    (NotFoundError, 404),
    (StaleStateError, 409),
    (TooLargeError, 413),
    (PolicyBlockedError, 422),
    # Bad input, never an outage: 503 would tell the sender to retry what cannot succeed.
    (MalformedInputError, 400),
    (InvalidValueError, 400),
    (DatabaseError, 503),
    (TransientError, 503),
    (ConfigError, 500),
]

REASONS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    411: "length_required",
    412: "precondition_failed",
    413: "too_large",
    415: "unsupported_media_type",
    416: "range_not_satisfiable",
    422: "unprocessable",
    423: "locked",
    429: "rate_limited",
    460: "checksum_mismatch",
    500: "internal",
    503: "unavailable",
}


class ApiError(Exception):
    """Raise from a handler to answer with this status, code and detail."""

    def __init__(
        self,
        status: int,
        detail: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code or REASONS.get(status, "error")
        self.detail = detail
        self.headers = headers
        self.field = field  # the JSON path (or header) the error is about, when one is


def problem(
    status: int,
    detail: str,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    field: str | None = None,
) -> web.Response:
    body: dict[str, Any] = {
        "error": {"code": code or REASONS.get(status, "error"), "detail": detail}
    }
    if field is not None:
        body["error"]["field"] = field
    response = web.json_response(body, status=status, headers=headers)
    if status == 408:
        # The rest of the body may still arrive: it must not be read as the next request.
        response.force_close()
    return response


def status_for(exc: AivedioError) -> int:
    return next((status for cls, status in STATUS_OF if isinstance(exc, cls)), 500)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return problem(exc.status, exc.detail, exc.code, headers=exc.headers, field=exc.field)
    except AivedioError as exc:
        status = status_for(exc)
        detail = redact_text(exc.detail) if status < 500 else exc.error_class
        if isinstance(exc, MalformedInputError):
            return problem(status, detail, exc.reason, field=exc.field)
        if status >= 500:
            log.warning(
                "request_failed",
                path=request.path,
                error_class=exc.error_class,
                detail=redact_text(exc.detail),
            )
        return problem(status, detail, exc.error_class)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.empty_body:
            raise
        return problem(exc.status, exc.reason, headers=_allow_header(exc))
    except web.RequestPayloadError:
        # The body's framing or encoding is broken (bad gzip, a bad chunk): the client's fault.
        # Not logged here: aiohttp meets the same error again when it drains the body after
        # the response, and http_server.py logs it there, once, without a traceback.
        return problem(400, "the request body could not be read", "malformed_body")
    except ConnectionResetError as exc:
        if request.transport is not None:  # not the client's connection: one of ours broke
            log.exception("request_crashed", path=request.path, method=request.method)
            return problem(500, "internal error")
        # The client went away mid-body (or sent framing the parser gave up on, which aiohttp
        # reports as the connection closing): nobody is left to answer, nothing of ours broke.
        log.warning("http_request_incomplete", error_class=type(exc).__name__, path=request.path)
        return problem(400, "the request body did not arrive whole", "incomplete_body")
    except Exception:
        log.exception("request_crashed", path=request.path, method=request.method)
        return problem(500, "internal error")


def _allow_header(exc: web.HTTPException) -> dict[str, str] | None:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else None
