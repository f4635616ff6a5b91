"""Writes deploy/image/requirements.txt: aivedio's runtime dependencies, locked for the image.

pyproject.toml names only lower bounds, so the image would otherwise get whatever PyPI serves
on the day it is built. This resolves the ``[project] dependencies`` once, for the image's
interpreter rather than the one running it (CPython 3.11 on x86_64 glibc 2.36, Debian 12),
binary wheels only (the image has no compiler), constrained to the versions installed in
``.venv`` so that the image runs what the test suite ran. Each line pins one version and the
SHA-256 of the one wheel pip chose, so ``pip download --require-hashes`` fetches exactly it.

    .venv/bin/python scripts/lib/image_lock.py   # run by `scripts/image --lock`
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy" / "image" / "requirements.txt"

# The image's interpreter and C library: Debian 12's python3 (3.11) and glibc 2.36. The
# tags are listed newest first because pip prefers a wheel for an earlier tag in this list.
PYTHON_VERSION = "3.11"
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
# Options that make pip resolve for the image's interpreter; scripts/image downloads with the
# same ones (IMAGE_PIP_OPTIONS there).
TARGET_OPTIONS = [
    "--only-binary=:all:",
    "--python-version",
    PYTHON_VERSION,
    "--implementation",
    "cp",
    "--abi",
    "cp311",
    *(option for platform in PLATFORMS for option in ("--platform", platform)),
]


def installed_versions() -> str:
    """The .venv's own packages as pip constraints (the editable aivedio left out)."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def resolve(dependencies: list[str], constraints: Path) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--dry-run",
                "--ignore-installed",
                "--disable-pip-version-check",
                *TARGET_OPTIONS,
                "--constraint",
                str(constraints),
                "--report",
                str(report),
                *dependencies,
            ],
            check=True,
        )
        installs: list[dict[str, object]] = json.loads(report.read_text())["install"]
        return installs


def lock_line(item: dict[str, object]) -> str:
    metadata = item["metadata"]
    download = item["download_info"]
    assert isinstance(metadata, dict) and isinstance(download, dict)
    hashes = download["archive_info"]["hashes"]
    wheel = str(download["url"]).rsplit("/", 1)[-1]
    return (
        f"{metadata['name'].lower()}=={metadata['version']} \\\n"
        f"    --hash=sha256:{hashes['sha256']}\n"
        f"    # {wheel}\n"
    )


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies: list[str] = project["dependencies"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write(installed_versions())
        constraints.flush()
        installs = resolve(dependencies, Path(constraints.name))
    installs.sort(key=lambda item: str(item["metadata"]["name"]).lower())  # type: ignore[index]
    header = (
        "# aivedio's runtime dependencies for the container image, one wheel each (CPython 3.11,\n"
        "# x86_64, glibc 2.36), written by `scripts/image --lock` from pyproject.toml's\n"
        "# [project] dependencies and the versions in .venv. Do not edit by hand.\n"
    )
    LOCK.write_text(header + "".join(lock_line(item) for item in installs))
    print(f"{LOCK.relative_to(ROOT)}: {len(installs)} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
