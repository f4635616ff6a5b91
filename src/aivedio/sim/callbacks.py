"""How the simulator signs the callbacks it sends to our API, in both schemes we accept.

``standard`` is Standard Webhooks (``webhook-id``, ``webhook-timestamp``,
``webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>``), the format
vendors such as Replicate and the Gemini API use and the one we send; the key is the secret's
base64 part when it is a ``whsec_`` secret, else its UTF-8 bytes (so one
``callback_secret`` serves both schemes). ``legacy`` is the earlier
``X-Aivedio-Timestamp`` + ``X-Aivedio-Signature: sha256=<hex HMAC-SHA256(secret,
"{timestamp}.{body}")>``, still accepted.
"""

from __future__ import annotations

import time
from typing import Literal

from aivedio.providers import hmac_callbacks, standard_webhooks

Scheme = Literal["standard", "legacy"]


def signed_headers(
    secret: str,
    body: bytes,
    *,
    scheme: Scheme = "standard",
    webhook_id: str,
    now: float | None = None,
) -> dict[str, str]:
    """The headers of one callback. ``webhook_id``: the delivery's id (the body's event id
    is the natural one; it is the same on the simulator's retries)."""
    stamp = str(int(time.time() if now is None else now))
    if scheme == "legacy":
        mac = hmac_callbacks.sign(secret.encode(), stamp, body)
        return {"X-Aivedio-Timestamp": stamp, "X-Aivedio-Signature": f"sha256={mac}"}
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": stamp,
        "webhook-signature": standard_webhooks.sign(
            standard_webhooks.callback_key(secret), webhook_id, stamp, body
        ),
    }
