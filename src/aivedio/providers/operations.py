"""Google long-running operations (Veo on the Gemini API and on Vertex AI): ``done``,
``error`` and ``response``, the same shape for both; the task id is the operation's name."""

from __future__ import annotations

from typing import Any

from aivedio.errors import InvalidResponseError, PolicyBlockedError
from aivedio.providers.base import path_segment


def operation_status(doc: dict[str, Any]) -> str:
    if not doc.get("done"):
        return "RUNNING"
    if doc.get("error"):
        return "FAILED"
    if not isinstance(doc.get("response"), dict):
        raise InvalidResponseError("operation is done without a response or an error")
    return "SUCCEEDED"


def operation_path(name: str, collection: str) -> str:
    """An operation name (``{collection}/…/operations/{id}``, pairs of collection and id) as a
    URL path, each segment held to the task-id rule (``base.path_segment``): a name is a
    tenant's input and must not climb out of the operation's resource with ``..``."""
    segments = name.split("/")
    if (
        len(segments) < 4
        or len(segments) % 2
        or segments[0] != collection
        or segments[-2] != "operations"
    ):
        shown = name[:80].encode("unicode_escape").decode()
        raise PolicyBlockedError(
            f"invalid_task_id: {shown!r} is not an operation name ({collection}/…/operations/…)"
        )
    return "/".join(path_segment(segment) for segment in segments)
