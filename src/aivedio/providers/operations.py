"""Google long-running operations (Veo on the Gemini API and on Vertex AI): ``done``,
``error`` and ``response``, the same shape for both."""

from __future__ import annotations

from typing import Any

from aivedio.errors import InvalidResponseError


def operation_status(doc: dict[str, Any]) -> str:
    if not doc.get("done"):
        return "RUNNING"
    if doc.get("error"):
        return "FAILED"
    if not isinstance(doc.get("response"), dict):
        raise InvalidResponseError("operation is done without a response or an error")
    return "SUCCEEDED"
