"""The listings and the commands that never touch a secret, as an operator runs them: a table
by default, JSON lines with --json, no URL encryption key asked for, and the exit statuses of
the one table (3 not found, 4 refused)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import structlog

from aivedio.cli import main as cli
from aivedio.cli.common import EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED


@pytest.fixture
def without_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The environment of a machine that holds no secret."""
    monkeypatch.delenv("AIVEDIO_URL_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("AIVEDIO_CONFIG", raising=False)
    saved = structlog.get_config()
    yield monkeypatch
    structlog.configure(**saved)  # the command configures logging for the whole process


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_migrate_runs_without_the_url_encryption_key(
    empty_database: str, without_key: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    without_key.setenv("AIVEDIO_DATABASE_URL", empty_database)
    code, _, err = run(capsys, "migrate")
    assert code == EXIT_OK, err
    code, out, err = run(capsys, "jobs", "list")
    assert code == EXIT_OK, err
    assert out.splitlines()[0].split() == list(cli.JOB_COLUMNS)


def test_the_listings_print_tables_and_json_lines_without_the_key(
    database: str, without_key: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    without_key.setenv("AIVEDIO_DATABASE_URL", database)
    code, out, err = run(capsys, "jobs", "enqueue", "diag.noop", "--count", "2")
    assert code == EXIT_OK, err
    assert json.loads(out)["created"] == 2
    code, out, _ = run(capsys, "jobs", "list", "--kind", "diag.noop")
    header, *rows = out.splitlines()
    assert header.split() == list(cli.JOB_COLUMNS)
    assert len(rows) == 2 and all(" diag.noop " in f" {row} " and "queued" in row for row in rows)
    # Every line of the table starts its columns at the header's offsets.
    at = header.index("status")
    assert all(row[at:].startswith("queued") for row in rows)
    code, out, _ = run(capsys, "jobs", "list", "--kind", "diag.noop", "--json")
    documents = [json.loads(line) for line in out.splitlines()]
    assert [d["kind"] for d in documents] == ["diag.noop", "diag.noop"]
    assert {"max_attempts", "lane", "last_error_detail"} <= set(documents[0])
    for argv in (["outputs", "list"], ["assets", "list"]):
        code, out, err = run(capsys, *argv)
        assert code == EXIT_OK, err
        assert out.splitlines()[1:] == ["(none)"]
        code, out, _ = run(capsys, *argv, "--json")
        assert (code, out) == (EXIT_OK, "")


def test_retry_says_not_found_and_refused_with_their_own_statuses(
    database: str, without_key: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    without_key.setenv("AIVEDIO_DATABASE_URL", database)
    code, _, err = run(capsys, "jobs", "retry", "987654")
    assert code == EXIT_NOT_FOUND and "does not exist" in err
    run(capsys, "jobs", "enqueue", "diag.noop")
    _, out, _ = run(capsys, "jobs", "list", "--json")
    queued = json.loads(out.splitlines()[0])["id"]
    code, _, err = run(capsys, "jobs", "retry", str(queued))
    assert code == EXIT_REFUSED and "is queued" in err


def test_assets_show_of_an_unknown_asset_is_not_found(
    database: str, without_key: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    without_key.setenv("AIVEDIO_DATABASE_URL", database)
    code, out, _ = run(capsys, "assets", "show", "1234fa64-63b0-431f-8ee3-e3a289a6e8fc")
    assert code == EXIT_NOT_FOUND and "no asset" in out
