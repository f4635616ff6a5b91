"""Playback tokens through a running API: ES256 keys from files, the JWKS an edge verifies
with, and a key rotation while clients keep playing.

The rotation: an API process's key list goes through the three steps of
``config/playback_keys.py`` (the new key added after the old, then first, then the old one
removed) while clients fetch segments with tokens handed out at every step. A fleet rolls
those steps one process at a time; here one process takes each step, and at steps 1 and 2
tokens of both keys are in the clients' hands, which is what a process of either step meets.
"""

from __future__ import annotations

import random
from pathlib import Path

import aiohttp
import anyio
import jwt
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from aivedio.api.tokens import AUDIENCE, ISSUER, signer_from
from aivedio.config.api import RateLimitsConfig
from aivedio.config.load import Config
from aivedio.config.playback_keys import PlaybackKeyConfig
from aivedio.store.database import Pool
from tests.support.api_rig import SEGMENT, open_api, published

pytestmark = pytest.mark.anyio


def key_file(directory: Path, name: str) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    path = directory / f"{name}.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(path)


def es256(kid: str, path: str) -> PlaybackKeyConfig:
    return PlaybackKeyConfig(kid=kid, algorithm="ES256", private_key_file=path)


async def test_an_edge_verifies_a_playback_token_with_the_published_key_set(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    keys = [es256("edge-1", key_file(tmp_path, "edge-1"))]
    async with open_api(config, pool, tmp_path, playback_keys=keys) as api:
        video = await published(api)
        play = await api.json("GET", f"/v1/videos/{video}/playback")
        async with api.http.get(f"{api.base}/.well-known/jwks.json") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("application/jwk-set+json")
            assert "max-age" in resp.headers["Cache-Control"]
            document = await resp.json(content_type=None)
        # What a CDN worker does with no call to the API: the key by kid, then the claims.
        key = jwt.PyJWKSet.from_dict(document)[jwt.get_unverified_header(play["token"])["kid"]]
        claims = jwt.decode(
            play["token"], key.key, algorithms=["ES256"], audience=AUDIENCE, issuer=ISSUER
        )
        assert claims["sub"] == str(video)
        assert play["mp4"].startswith(f"{api.base}/media/{play['token']}/")
        path = play["mp4"].split(f"/media/{play['token']}/", 1)[1]
        assert (claims["pfx"] + path).endswith("/rev/1/playback.mp4")
        async with api.http.get(play["mp4"]) as resp:
            assert resp.status == 200 and await resp.read() == SEGMENT


async def test_a_key_rotation_under_load_refuses_no_token_it_handed_out(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    old = es256("old", key_file(tmp_path, "old"))
    new = es256("new", key_file(tmp_path, "new"))
    # The load is the point here, not the per-address rate limit.
    limits = RateLimitsConfig(enabled=False)
    async with open_api(config, pool, tmp_path, playback_keys=[old], rate_limits=limits) as api:
        video = await published(api)
        tokens: dict[str, list[str]] = {"old": [], "new": []}
        outcomes: dict[int, int] = {}
        done = anyio.Event()

        async def hand_out() -> None:
            token = (await api.json("GET", f"/v1/videos/{video}/playback"))["token"]
            tokens[jwt.get_unverified_header(token)["kid"]].append(token)

        async def client(session: aiohttp.ClientSession) -> None:
            while not done.is_set():
                held = tokens["old"] + tokens["new"]
                token = random.choice(held)
                async with session.get(f"{api.base}/media/{token}/playback.mp4") as resp:
                    await resp.read()
                    outcomes[resp.status] = outcomes.get(resp.status, 0) + 1

        def rotate(*keys: PlaybackKeyConfig) -> None:
            # A process restarted with this key list (the config it would load).
            api_config = msgspec.structs.replace(api.ctx.config.api, playback_keys=list(keys))
            api.ctx.signer = signer_from(api_config)

        await hand_out()
        async with aiohttp.ClientSession() as session, anyio.create_task_group() as group:
            for _ in range(8):
                group.start_soon(client, session)
            for step in ([old, new], [new, old]):
                await anyio.sleep(0.3)
                rotate(*step)
                for _ in range(3):
                    await hand_out()
            await anyio.sleep(0.3)
            done.set()
        assert len(tokens["old"]) == 4 and len(tokens["new"]) == 3
        assert set(outcomes) == {200} and sum(outcomes.values()) > 50, outcomes
        # Step 3, after the tokens' TTL: the old key removed, its tokens refused.
        rotate(new)
        for kid, expected in (("old", 403), ("new", 200)):
            async with api.http.get(f"{api.base}/media/{tokens[kid][0]}/playback.mp4") as resp:
                assert resp.status == expected, kid
