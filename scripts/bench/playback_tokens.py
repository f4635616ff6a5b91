"""Playback tokens: what issuing and verifying a JWT costs per request, by algorithm.

Every ``/media/{token}/…`` request verifies its token (``api/tokens.py``): a player fetching
an HLS stream sends the same token with every segment, so a process verifies a token's
signature once and then finds it in its cache (the expiry is still checked each time).
Measured in this process, for HS256, ES256 (P-256) and RS256 (2048 bits):

* ``issue``: one token signed (``GET /v1/videos/{id}/playback``);
* ``verify, first use``: a token this process has not seen: header, signature, claims;
* ``verify, cached``: the same token again (the common case of a segment request).

Peers in the same run: the format before JWTs (base64 JSON + HMAC-SHA256, verified with
``playback_token_secret``) and the floor of any MAC check, one HMAC-SHA256 over a token's
bytes. Each figure is the median of ``--rounds`` rounds of ``--tokens`` operations.

Usage: .venv/bin/python scripts/bench/playback_tokens.py [--tokens 2000] [--rounds 5] [--smoke]
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import base64
import hashlib
import hmac
import json
import os
import platform
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from aivedio.api.token_keys import PlaybackKey
from aivedio.api.tokens import Claims, TokenSigner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from smoke import positive, verdict

SECRET = b"s" * 32


def signers() -> dict[str, TokenSigner]:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return {
        "HS256": TokenSigner.hs256(SECRET),
        "ES256": TokenSigner([PlaybackKey("e", "ES256", ec_key, ec_key.public_key())]),
        "RS256": TokenSigner([PlaybackKey("r", "RS256", rsa_key, rsa_key.public_key())]),
    }


def legacy_token(claims: Claims) -> str:
    """A token of the format before JWTs, as that code issued it."""
    body = base64.urlsafe_b64encode(msgspec.json.encode(claims)).rstrip(b"=").decode()
    mac = hmac.new(SECRET, b"aivedio-playback-v1." + body.encode(), hashlib.sha256).digest()
    return body + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def per_op_us(operation: Callable[[str], object], tokens: list[str]) -> float:
    started = time.perf_counter()
    for token in tokens:
        operation(token)
    return (time.perf_counter() - started) / len(tokens) * 1e6


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, dict[str, float]] = {}
    assets = [uuid.uuid4() for _ in range(args.tokens)]
    for name, signer in signers().items():
        issue, first, cached = [], [], []
        for _ in range(args.rounds):
            # A fresh signer per round: an empty cache, so every first verify is a real one.
            fresh = TokenSigner(signer.keys, legacy_secret=SECRET)
            started = time.perf_counter()
            tokens = [fresh.issue(1, asset, 1, 3600)[0] for asset in assets]
            issue.append((time.perf_counter() - started) / len(assets) * 1e6)
            first.append(per_op_us(fresh.verify, tokens))
            cached.append(per_op_us(fresh.verify, tokens))
        rows[name] = {
            "issue_us": statistics.median(issue),
            "verify_first_us": statistics.median(first),
            "verify_cached_us": statistics.median(cached),
            "token_chars": len(tokens[0]),
        }
    expiry = int(time.time()) + 3600
    old = [legacy_token(Claims(1, asset, 1, expiry)) for asset in assets]
    legacy_first, floor = [], []
    for _ in range(args.rounds):
        legacy_first.append(per_op_us(TokenSigner.hs256(SECRET).verify, old))
        floor.append(
            per_op_us(lambda t: hmac.new(SECRET, t.encode(), hashlib.sha256).digest(), old)
        )
    rows["format before (HMAC)"] = {
        "verify_first_us": statistics.median(legacy_first),
        "token_chars": len(old[0]),
    }
    rows["floor: one HMAC-SHA256"] = {"verify_first_us": statistics.median(floor)}
    return {
        "tokens": args.tokens,
        "rounds": args.rounds,
        "rows": rows,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"== playback tokens: {result['tokens']} tokens x {result['rounds']} rounds, "
        f"median per operation; {result['machine']['cpus']} CPUs, {result['at']}"
    )
    print("| tokens | issue | verify, first use | verify, cached | token length |")
    print("|---|---:|---:|---:|---:|")
    for name, row in result["rows"].items():
        cells = [
            f"{row[k]:.1f} us" if k in row else "-"
            for k in ("issue_us", "verify_first_us", "verify_cached_us")
        ]
        chars = f"{row['token_chars']} chars" if "token_chars" in row else "-"
        print(f"| {name} | {' | '.join(cells)} | {chars} |")


def sanity(result: dict[str, Any]) -> list[str]:
    problems = []
    for name in ("HS256", "ES256", "RS256"):
        row = result["rows"][name]
        for key in ("issue_us", "verify_first_us", "verify_cached_us"):
            if not positive(row[key]):
                problems.append(f"{name} {key} = {row[key]}")
        if row["verify_cached_us"] >= row["verify_first_us"]:
            problems.append(f"{name}: a cached verify is not cheaper than a first one")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("var/bench-tokens"))
    parser.add_argument("--smoke", action="store_true", help="50 tokens, 1 round; sanity")
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.rounds = 50, 1
    result = measure(args)
    report(result)
    if not args.smoke:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"result-{result['at'].replace(':', '')}.json"
        path.write_text(json.dumps(result, indent=1))
        print(f"  result: {path}")
    return verdict("playback_tokens", sanity(result)) if args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(main())
