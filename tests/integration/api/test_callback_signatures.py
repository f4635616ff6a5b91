"""A generic provider's callback signed in either scheme: Standard Webhooks (what our
simulator sends, ``sim/callbacks.py``) or the legacy ``X-Aivedio-Signature``; both verified
before anything is recorded, both under the same ``callback_secret``."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import msgspec
import pytest

from aivedio.config.load import Config, ProviderConfig
from aivedio.providers import standard_webhooks
from aivedio.sim.callbacks import Scheme, signed_headers
from aivedio.store.database import Pool
from tests.integration.api.test_edge import generic_body, post, recorded
from tests.support.api_rig import open_api
from tests.support.edge_client import SECRET, with_edge_providers

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CALLBACK = "/v1/providers/sim/callbacks"
JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("scheme", ["standard", "legacy"])
async def test_the_simulators_callback_is_accepted_in_either_scheme(
    config: Config, pool: Pool, tmp_path: Path, scheme: Scheme
) -> None:
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        body = generic_body("evt-7")
        headers = signed_headers(SECRET, body, scheme=scheme, webhook_id="evt-7")
        status, answer = await post(api, CALLBACK, body, {**headers, **JSON})
        assert status == 202, answer
        assert await recorded(pool) == (1, 1)
        # The same event again, freshly signed: recorded once, refused as a replay.
        again = signed_headers(SECRET, body, scheme=scheme, webhook_id="evt-7")
        status, answer = await post(api, CALLBACK, body, {**again, **JSON})
        assert (status, answer["error"]["code"]) == (409, "replayed_event")


async def test_a_whsec_callback_secret_is_used_as_standard_webhooks_defines_it(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    providers = {"sim": ProviderConfig(callback_secret=secret, tenant="acme")}
    async with open_api(
        msgspec.structs.replace(config, providers=providers), pool, tmp_path
    ) as api:
        body = generic_body()
        headers = signed_headers(secret, body, webhook_id="evt-1")
        # What a Standard Webhooks library signs with that secret: the key is b"k" * 32.
        stamp = headers["webhook-timestamp"]
        assert headers["webhook-signature"] == standard_webhooks.sign(
            b"k" * 32, "evt-1", stamp, body
        )
        status, answer = await post(api, CALLBACK, body, {**headers, **JSON})
        assert status == 202, answer


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ("body", "webhook-signature does not match"),
        ("secret", "webhook-signature does not match"),
        ("stale", "webhook-timestamp outside"),
        ("no id", "webhook-id, webhook-timestamp and webhook-signature headers are required"),
    ],
)
async def test_a_bad_standard_webhooks_signature_is_401_and_records_nothing(
    config: Config, pool: Pool, tmp_path: Path, change: str, detail: str
) -> None:
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        body = generic_body()
        secret = "another secret" if change == "secret" else SECRET
        now = time.time() - 3600 if change == "stale" else None
        headers = signed_headers(secret, body, webhook_id="evt-1", now=now)
        if change == "no id":
            del headers["webhook-id"]
        sent = body + b" " if change == "body" else body
        status, answer = await post(api, CALLBACK, sent, {**headers, **JSON})
        assert status == 401
        assert answer["error"]["code"] == "bad_signature"
        assert answer["error"]["detail"].startswith(detail)
        assert await recorded(pool) == (0, 0)
