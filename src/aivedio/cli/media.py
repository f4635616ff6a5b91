"""``aivedio probe FILE`` and ``aivedio process FILE --out DIR``: the media stage locally.

``probe`` prints one JSON verdict (``verdict``, ``error_class``, ``reasons``, the media
summary, and ``provenance``: the C2PA manifest summary with its validation state, read in
the sandbox) and exits 0 when valid, 5 when invalid (``--provider`` applies that provider's
tolerances and its ``require_provenance``). ``process`` runs the whole DAG without a
database or an object store and writes the revision's files under DIR exactly as they
would sit under ``assets/{tenant}/{asset}/rev/{n}/``, then prints a JSON summary: the plan,
every output with its checksums (and its C2PA signing, ``c2pa``, when ``[provenance]``
configures a signer: the playback, proxy and poster signed before they are hashed), the
time per node and step, and each ffmpeg process's
wall time, CPU time and peak RSS. Exit 0 when every required output was made, 5 when the
source is invalid, 1 when a required output failed. On a terminal (stdout a TTY) it
draws the render's progress on one line while it runs (``aivedio.progress``), cleared
before the summary; piped, stdout is the JSON alone.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TextIO

import anyio

from aivedio import progress
from aivedio.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID_MEDIA,
    EXIT_OK,
    EXIT_USAGE,
    print_json,
)
from aivedio.config.load import Config
from aivedio.config.media import OUTPUT_TYPES
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.provenance_read import ProvenanceReader
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.ffmpeg.verdict import inspect_file, verdict_json
from aivedio.pipeline.media import av1
from aivedio.pipeline.media.validate import Declared


def _declared(args: argparse.Namespace) -> Declared | None:
    width = height = None
    if args.expect_resolution:
        try:
            w, h = args.expect_resolution.lower().split("x")
            width, height = int(w), int(h)
        except ValueError:
            raise SystemExit(
                f"aivedio: --expect-resolution must look like 1280x720, "
                f"not {args.expect_resolution!r}"
            ) from None
    if args.expect_duration is None and width is None:
        return None
    return Declared(duration_seconds=args.expect_duration, width=width, height=height)


def _source(args: argparse.Namespace) -> Path | None:
    path = Path(args.file)
    if not path.is_file():
        print(f"aivedio: {args.file}: no such file", file=sys.stderr)
        return None
    return path


def cmd_probe(config: Config, args: argparse.Namespace) -> int:
    path = _source(args)
    if path is None:
        return EXIT_USAGE
    tolerance = config.media.tolerances.get(args.provider) if args.provider else None

    async def main() -> int:
        sandbox = Sandbox(config.media)
        verdict, _ = await inspect_file(
            sandbox,
            path,
            declared=_declared(args),
            tolerance=tolerance,
            provenance=_reader(config, sandbox),
            require_provenance=_requires(config, args.provider),
        )
        print_json(verdict_json(verdict))
        return EXIT_OK if verdict.valid else EXIT_INVALID_MEDIA

    return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})


def _reader(config: Config, sandbox: Sandbox) -> ProvenanceReader | None:
    return ProvenanceReader(sandbox, config.provenance) if config.provenance.read else None


def _requires(config: Config, provider: str | None) -> bool:
    found = config.providers.get(provider or "")
    return found is not None and found.require_provenance


def cmd_process(config: Config, args: argparse.Namespace) -> int:
    path = _source(args)
    if path is None:
        return EXIT_USAGE
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        print(f"aivedio: --out {out} is a file, not a directory", file=sys.stderr)
        return EXIT_USAGE
    if out.exists() and any(out.iterdir()):
        print(f"aivedio: --out {out} is not empty; outputs are never overwritten", file=sys.stderr)
        return EXIT_USAGE
    tolerance = config.media.tolerances.get(args.provider) if args.provider else None
    wants = [w.strip() for w in args.only.split(",") if w.strip()] if args.only else None
    unknown = sorted(set(wants or []) - set(OUTPUT_TYPES))
    if unknown or wants == []:
        print(
            f"aivedio: --only: unknown output(s) {unknown or args.only!r}; known: "
            f"{', '.join(OUTPUT_TYPES)}",
            file=sys.stderr,
        )
        return EXIT_USAGE

    line = ProgressLine(sys.stdout) if sys.stdout.isatty() else None
    from aivedio.provenance.signing import signing_from_config  # loads c2pa: only here

    signing = signing_from_config(config.provenance)

    async def main() -> int:
        sandbox = Sandbox(config.media)
        if line is not None:
            progress.current.set(progress.Meter(on_change=line.draw))
        with sandbox.scratch() as root:
            run = MediaRun(sandbox, path, root, parallel=_media_slots(config))
            run.provenance_reader = _reader(config, sandbox)
            run.require_provenance = _requires(config, args.provider)
            run.signing = signing
            run.av1 = av1.wanted(config.media, None)  # no tenant: the pipeline version's
            # The decode check beside the outputs (a failed one discards them all).
            report = await run.run_checked(
                wants=wants, declared=_declared(args), tolerance=tolerance
            )
            if report.verdict.valid:
                files = [f.path for r in report.outputs.values() for f in r.files]
                await anyio.to_thread.run_sync(_move, run.layout.out, out, files)
        summary = report.to_json()
        summary["out"] = str(out)
        if line is not None:
            line.clear()
        print_json(summary)
        if not report.verdict.valid:
            return EXIT_INVALID_MEDIA
        return EXIT_OK if report.required_done else EXIT_FAILED

    return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})


class ProgressLine:
    """The render's progress on one terminal line, redrawn in place when its whole percent
    changes (so at most a hundred writes however often ffmpeg reports)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._shown: int | None = None

    def draw(self, fraction: float) -> None:
        whole = int(fraction * 100)
        if whole == self._shown:
            return
        self._shown = whole
        self._stream.write(f"\rrendering {whole:3d}%")
        self._stream.flush()

    def clear(self) -> None:
        if self._shown is not None:
            self._stream.write("\r\x1b[K")


def _move(source: Path, target: Path, files: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(source / name, target / name)


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    for name, fn, text in (
        ("probe", cmd_probe, "sniff, probe, validate and decode-check one file; JSON verdict"),
        ("process", cmd_process, "run the whole media DAG on one file, no database needed"),
    ):
        parser = sub.add_parser(name, parents=[common], help=text)
        parser.add_argument("file", help="a local media file")
        parser.add_argument("--provider", help="apply [media.tolerances.PROVIDER]")
        parser.add_argument("--expect-duration", type=float, help="declared duration (s)")
        parser.add_argument("--expect-resolution", help="declared WxH, e.g. 1280x720")
        if name == "process":
            parser.add_argument("--out", required=True, help="directory for the outputs")
            parser.add_argument("--only", help="comma-separated outputs (default: all)")
        parser.set_defaults(fn=fn)


def _media_slots(config: Config) -> int:
    """The media lane's slots: as many local ffmpeg processes as a worker would run."""
    lane = config.worker.lanes.get("media")
    return lane.slots if lane is not None and lane.slots > 0 else 1
