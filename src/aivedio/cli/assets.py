"""``aivedio assets list`` and ``aivedio assets show ID``: what an operator asks on call.

``list`` prints one JSON object per asset (newest first): status, current revision, the
last error. ``show`` prints the asset, each revision (status, plan mode, required and
optional outputs) and each variant (status, object key, size, checksum, error, and when
it was deferred under backlog pressure); then the asset's media crashes (poison media).
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from aivedio.cli.common import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, parse_uuids, plain, print_json
from aivedio.config.load import Config
from aivedio.store import asset_reads
from aivedio.store.database import open_pool


def _text(document: dict[str, Any]) -> str:
    a = document
    lines = [
        f"asset {a['id']}: {a['status']}, {a['width']}x{a['height']} {a['video_codec']}"
        + (f", {a['last_error_class']}: {a['last_error_detail']}" if a["last_error_class"] else "")
    ]
    for r in a["revisions"]:
        lines.append(
            f"  revision {r['revision']}: {r['status']}, plan {r['mode']}, "
            f"required {', '.join(r['required_outputs'])}"
        )
        for v in r["variants"]:
            where = v["object_key"].rsplit("/rev/", 1)[-1]
            size = v["total_bytes"] or 0
            error = f"  {v['error']}" if v["error"] else ""
            if v.get("deferred_at"):
                error += f"  (deferred under backlog since {v['deferred_at']})"
            lines.append(
                f"    {v['variant_type']:<10} {v['status']:<10} {size:>10} bytes  {where}{error}"
            )
    for c in a.get("crashes", []):
        lines.append(
            f"  crash: {c['cause']} in {c['kind']} job {c['job_id']} at "
            f"{c['created_at']}: {c['detail']}"
        )
    return "\n".join(lines)


def cmd_assets_list(config: Config, args: argparse.Namespace) -> int:
    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            rows = await asset_reads.list_assets(pool, args.status, args.limit)
        for row in rows:
            print_json(plain(row))
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
        if args.text:
            print(_text(document))
        else:
            print_json(document)
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    assets = sub.add_parser("assets", help="assets, their revisions and outputs")
    assets_sub = assets.add_subparsers(dest="assets_command", required=True)
    listing = assets_sub.add_parser("list", parents=[common], help="assets, newest first")
    listing.add_argument("--status", help="e.g. PROCESSING, INVALID_MEDIA, PROCESSING_FAILED")
    listing.add_argument("--limit", type=int, default=50)
    listing.set_defaults(fn=cmd_assets_list, needs_secret=False)
    show = assets_sub.add_parser("show", parents=[common], help="one asset in full")
    show.add_argument("asset_id")
    show.add_argument("--text", action="store_true", help="a few lines for people, not JSON")
    show.set_defaults(fn=cmd_assets_show, needs_secret=False)
