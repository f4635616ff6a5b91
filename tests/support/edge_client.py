"""What hostile or merely slow clients send to the API's edge, for the edge tests.

``raw_post`` speaks HTTP/1.1 over a plain socket so a test decides exactly which bytes go
out in which TCP segment and when (a body in delayed pieces, chunked pieces, a
``Content-Length`` larger than what is sent); aiohttp's client would send a body whole.
The signers make a body pass each callback scheme's verification, so what is tested is the
decoding after it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from urllib.parse import urlsplit

import anyio
import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from aivedio.config.load import Config, ProviderConfig
from aivedio.providers import fal_webhooks, hmac_callbacks, standard_webhooks

SECRET = "cb-secret-for-edge-tests"
WEBHOOK_SECRET = "whsec_" + "ZWRnZS10ZXN0cy13ZWJob29rLXNlY3JldA=="
FAL_KEY = Ed25519PrivateKey.generate()


def fal_jwks() -> str:
    import base64

    raw = FAL_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return msgspec.json.encode({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x}]}).decode()


def with_edge_providers(config: Config) -> Config:
    """A generic provider (``sim``), Replicate (Standard Webhooks, recorded from the body),
    fal (ED25519, inline JWKS) and Luma (unsigned: a hint), all of tenant acme."""
    providers = {
        "sim": ProviderConfig(callback_secret=SECRET, tenant="acme"),
        "replicate": ProviderConfig(
            adapter="replicate", api_key="k", webhook_secret=WEBHOOK_SECRET, tenant="acme"
        ),
        "fal": ProviderConfig(
            adapter="fal", api_key="k", app_id="fal-ai/x", jwks=fal_jwks(), tenant="acme"
        ),
        "luma": ProviderConfig(adapter="luma", api_key="k", tenant="acme"),
    }
    return msgspec.structs.replace(config, providers=providers)


def signed_generic(body: bytes, timestamp: str | None = None) -> dict[str, str]:
    stamp = timestamp or str(int(time.time()))
    return {
        "X-Aivedio-Timestamp": stamp,
        "X-Aivedio-Signature": "sha256=" + hmac_callbacks.sign(SECRET.encode(), stamp, body),
        "Content-Type": "application/json",
    }


def signed_replicate(body: bytes, webhook_id: str = "msg_1") -> dict[str, str]:
    stamp = str(int(time.time()))
    key = standard_webhooks.secret_key(WEBHOOK_SECRET)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": stamp,
        "webhook-signature": standard_webhooks.sign(key, webhook_id, stamp, body),
        "Content-Type": "application/json",
    }


def signed_fal(body: bytes, request_id: str = "req-1") -> dict[str, str]:
    stamp = str(int(time.time()))
    signature = FAL_KEY.sign(fal_webhooks.message(request_id, "user-1", stamp, body)).hex()
    return {
        "X-Fal-Webhook-Request-Id": request_id,
        "X-Fal-Webhook-User-Id": "user-1",
        "X-Fal-Webhook-Timestamp": stamp,
        "X-Fal-Webhook-Signature": signature,
        "Content-Type": "application/json",
    }


SIGNERS = {
    "sim": signed_generic,
    "replicate": signed_replicate,
    "fal": signed_fal,
    "luma": lambda body: {"Content-Type": "application/json"},
}


class Answer(msgspec.Struct, frozen=True):
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float  # from the last byte sent to the answer

    def json(self) -> object:
        return msgspec.json.decode(self.body)


async def raw_post(
    base: str,
    path: str,
    headers: dict[str, str],
    pieces: Sequence[bytes],
    *,
    gap_seconds: float = 0.3,
    content_length: int | None = None,
    chunked: bool = False,
    timeout_seconds: float = 20.0,
    method: str = "POST",
) -> Answer:
    """POST (or ``method``) ``pieces`` as separate TCP segments, ``gap_seconds`` apart (the
    first right after the head); chunked: each piece one chunk, then the last chunk. The
    answer, read whole."""
    url = urlsplit(base)
    total = sum(len(p) for p in pieces)
    head = [f"{method} {path} HTTP/1.1", f"Host: {url.netloc}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    if chunked:
        head.append("Transfer-Encoding: chunked")
    if content_length is not None or not chunked:
        head.append(f"Content-Length: {total if content_length is None else content_length}")
    segments = (
        [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces] if chunked else list(pieces)
    )
    if chunked:
        segments.append(b"0\r\n\r\n")
    async with await anyio.connect_tcp(url.hostname or "127.0.0.1", url.port or 80) as stream:
        await stream.send("\r\n".join(head).encode() + b"\r\n\r\n")
        for number, segment in enumerate(segments):
            if number:
                await anyio.sleep(gap_seconds)
            await stream.send(segment)
        sent = time.monotonic()
        with anyio.fail_after(timeout_seconds):
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            raw_head, _, rest = data.partition(b"\r\n\r\n")
            status_line, *lines = raw_head.decode("latin-1").split("\r\n")
            answer_headers = {
                k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)
            }
            length = int(answer_headers.get("content-length", "0"))
            while len(rest) < length:
                rest += await stream.receive()
    return Answer(int(status_line.split()[1]), answer_headers, rest, time.monotonic() - sent)


def split(body: bytes, parts: int) -> list[bytes]:
    """``body`` cut into ``parts`` pieces of about equal size."""
    step = -(-len(body) // parts)
    return [body[i : i + step] for i in range(0, len(body), step)]
