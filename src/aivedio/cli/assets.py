"""``aivedio assets list`` and ``aivedio assets show ID``: what an operator asks on call.

``list`` prints a table of assets (newest first): status, current revision, the last
error. ``show`` prints the asset, a table of its revisions (status, plan mode, required
outputs), a table of its variants (status, size, object key, error, and when it was
deferred under backlog pressure), then the asset's media crashes (poison media). With
``--json`` both print JSON: one object a line, or the asset as one document.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from aivedio.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    emit,
    parse_uuids,
    plain,
    print_json,
    table,
)
from aivedio.config.load import Config
from aivedio.store import asset_reads
from aivedio.store.database import open_pool

ASSET_COLUMNS = (
    "id",
    "status",
    "current_revision",
    "width",
    "height",
    "video_codec",
    "last_error_class",
    "created_at",
)


def _text(document: dict[str, Any]) -> str:
    a = document
    lines = [
        f"asset {a['id']}: {a['status']}, {a['width']}x{a['height']} {a['video_codec']}"
        + (f", {a['last_error_class']}: {a['last_error_detail']}" if a["last_error_class"] else ""),
        "",
        table(a["revisions"], ("revision", "status", "mode", "required_outputs")),
    ]
    variants = [
        {
            **v,
            "bytes": v["total_bytes"] or 0,
            "object": v["object_key"].rsplit("/rev/", 1)[-1],
            "deferred_since": v.get("deferred_at"),
        }
        for r in a["revisions"]
        for v in r["variants"]
    ]
    columns = ("revision", "variant_type", "status", "bytes", "object", "error", "deferred_since")
    lines += ["", table(variants, columns)]
    if a.get("crashes"):
        lines += ["", table(a["crashes"], ("created_at", "cause", "kind", "job_id", "detail"))]
    return "\n".join(lines)


def cmd_assets_list(config: Config, args: argparse.Namespace) -> int:
    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            rows = await asset_reads.list_assets(pool, args.status, args.limit)
        emit([plain(row) for row in rows], ASSET_COLUMNS, as_json=args.json)
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def cmd_assets_show(config: Config, args: argparse.Namespace) -> int:
    ids = parse_uuids([args.asset_id])
    if not ids:
        print(f"aivedio: {args.asset_id!r} is not an asset id (a UUID)")
        return EXIT_USAGE
    asset_id = ids[0]

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            found = await asset_reads.asset_detail(pool, asset_id)
        if found is None:
            print(f"aivedio: no asset {asset_id}")
            return EXIT_NOT_FOUND
        asset, revisions, variants, crashes = found
        document = plain(asset)
        document["crashes"] = [plain(c) for c in crashes]
        document["revisions"] = [plain(r) for r in revisions]
        for revision in document["revisions"]:
            revision["variants"] = [
                plain(v) for v in variants if v["revision"] == revision["revision"]
            ]
        if args.json:
            print_json(document)
        else:
            print(_text(document))
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    assets = sub.add_parser("assets", help="assets, their revisions and outputs")
    assets_sub = assets.add_subparsers(dest="assets_command", required=True)
    listing = assets_sub.add_parser("list", parents=[common], help="assets, newest first")
    listing.add_argument("--status", help="e.g. PROCESSING, INVALID_MEDIA, PROCESSING_FAILED")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    listing.add_argument("--json", action="store_true", help="one JSON object a line")
    listing.set_defaults(fn=cmd_assets_list)
    show = assets_sub.add_parser("show", parents=[common], help="one asset in full")
    show.add_argument("asset_id", help="the asset's id (a UUID)")
    show.add_argument("--json", action="store_true", help="one JSON document instead of text")
    show.set_defaults(fn=cmd_assets_show)
