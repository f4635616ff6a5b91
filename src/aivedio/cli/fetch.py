"""``aivedio fetch``: the worker's guarded fetch as a standalone command.

For operators ("would the fleet fetch this URL, and what would it see?") and for black-box
checks of the policy. One JSON object per URL on stdout, in order: ``url`` (query string
removed), ``outcome`` (``allowed`` for a passing dry run, ``stored``, ``blocked``,
``failed``), ``error_class``, ``detail`` (never a secret), ``addresses``, ``redirects``
(hosts only), ``bytes``, ``sha256``, ``resumes`` and ``restarts`` (times a body cut short
was continued from its last byte, or started over from byte 0). Exit status: 0 allowed or
stored, 4 blocked (refused), 1 failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import anyio
import msgspec

from aivedio.cli.common import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, print_json, usage
from aivedio.config.load import Config, validate_net
from aivedio.errors import AivedioError, ChecksumMismatchError, PolicyBlockedError
from aivedio.net.policy import redact_url
from aivedio.pipeline.services import make_fetcher


def _usage(message: str) -> int:
    return usage("aivedio fetch", message)


def _net_with_overrides(config: Config, args: argparse.Namespace) -> Any:
    net = config.net
    changes: dict[str, Any] = {}
    for option, key in (
        ("allow_host_suffix", "allowed_host_suffixes"),
        ("allow_scheme", "allowed_schemes"),
        ("allow_port", "allowed_ports"),
        ("allow_cidr", "allow_cidrs"),
        ("nameserver", "nameservers"),
    ):
        value = getattr(args, option)
        if value is not None:
            changes[key] = list(value)
    if args.ca_file:
        changes["ca_file"] = args.ca_file
    if args.max_bytes is not None:
        changes["max_bytes"] = args.max_bytes
    return msgspec.structs.replace(net, **changes)


def _headers(raw: list[str]) -> dict[str, str] | None:
    headers: dict[str, str] = {}
    for item in raw:
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or any(c in name for c in " \r\n") or "\n" in value:
            return None
        headers[name.strip()] = value.strip()
    return headers


def prepare(
    config: Config, args: argparse.Namespace
) -> tuple[list[str], dict[str, str], Any] | int:
    """Check the command line before any I/O; an int is an exit status."""
    urls = list(args.urls)
    if args.urls_from:
        try:
            text = Path(args.urls_from).read_text(encoding="utf-8")
        except OSError as exc:
            return _usage(f"--urls-from {args.urls_from}: {exc.strerror}")
        # A line is a URL as written: trimming would let " https://…" pass as "https://…"
        # (the policy refuses whitespace), and splitlines() would also split at \v, \f or
        # U+2028 inside a line. Only a line end ends a line; blank lines are skipped.
        urls += [line for line in text.split("\n") if line.strip()]
    if not urls:
        return _usage("give a URL (or --urls-from FILE with --dry-run)")
    if len(urls) > 1 and not args.dry_run:
        return _usage("several URLs are checked only with --dry-run")
    headers = _headers(args.header)
    if headers is None:
        return _usage("--header takes 'NAME: VALUE'")
    if args.ca_file and not Path(args.ca_file).is_file():
        return _usage(f"--ca-file {args.ca_file}: no such file")
    try:
        net = _net_with_overrides(config, args)
        validate_net(msgspec.structs.replace(config, net=net))
    except AivedioError as exc:
        return _usage(exc.detail)
    return urls, headers, net


# The command exits with its worst URL's status: a failure over a block over success.
_SEVERITY = (EXIT_OK, EXIT_REFUSED, EXIT_FAILED)


async def run_fetch_command(
    urls: list[str], headers: dict[str, str], net: Any, args: argparse.Namespace
) -> int:
    fetcher = make_fetcher(net)
    worst = EXIT_OK
    try:
        for url in urls:
            record = await _one(fetcher, url, args, headers)
            print_json(record, flush=True)
            code = {"blocked": EXIT_REFUSED, "failed": EXIT_FAILED}.get(record["outcome"], EXIT_OK)
            worst = max(worst, code, key=_SEVERITY.index)
    finally:
        with anyio.CancelScope(shield=True):
            await fetcher.aclose()
    return worst


async def _one(
    fetcher: Any, url: str, args: argparse.Namespace, headers: dict[str, str]
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "url": redact_url(url),
        "outcome": None,
        "error_class": None,
        "detail": None,
        "addresses": [],
        "redirects": [],
        "bytes": 0,
        "sha256": None,
        "resumes": 0,
        "restarts": 0,
    }
    out_path = Path(args.out) if args.out else None
    partial = out_path.with_name(f".{out_path.name}.part-{os.getpid()}") if out_path else None
    try:
        if args.dry_run:
            _target, addresses = await fetcher.check(url)
            record.update(outcome="allowed", addresses=addresses)
            return record
        handle = await anyio.open_file(partial, "wb") if partial else None
        try:

            async def sink(chunk: bytes) -> None:
                if handle is not None:
                    await handle.write(chunk)

            async def restart() -> None:
                # The origin answered a resume with the whole body: the file starts over.
                if handle is not None:
                    await handle.seek(0)
                    await handle.truncate()

            result = await fetcher.stream(url, sink, headers=headers, restart=restart)
            record.update(
                addresses=result.addresses,
                redirects=result.redirects,
                bytes=result.bytes,
                sha256=result.sha256,
                resumes=result.resumes,
                restarts=result.restarts,
            )
            if args.expect_size is not None and result.bytes != args.expect_size:
                raise ChecksumMismatchError(f"size {result.bytes}, expected {args.expect_size}")
            if args.expect_sha256 and result.sha256 != args.expect_sha256.lower():
                raise ChecksumMismatchError(
                    f"sha256 {result.sha256}, expected {args.expect_sha256.lower()}"
                )
        finally:
            if handle is not None:
                await handle.aclose()
        if partial is not None and out_path is not None:
            partial.replace(out_path)
        record.update(
            outcome="stored",
            addresses=result.addresses,
            redirects=result.redirects,
            bytes=result.bytes,
            sha256=result.sha256,
            resumes=result.resumes,
            restarts=result.restarts,
        )
    except AivedioError as exc:
        state = getattr(exc, "fetch_state", None)
        if state is not None:
            record.update(
                addresses=state.addresses,
                redirects=state.redirects,
                bytes=state.bytes,
                resumes=state.resumes,
                restarts=state.restarts,
            )
        record.update(
            outcome="blocked" if isinstance(exc, PolicyBlockedError) else "failed",
            error_class=exc.error_class,
            detail=exc.detail,
        )
    finally:
        if partial is not None and partial.exists():
            partial.unlink()
    return record
