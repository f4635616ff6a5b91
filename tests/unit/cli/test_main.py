"""The command line as an operator meets it: --version, help, examples, exit statuses, which
commands ask for the URL encryption key, and the one table renderer."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import pytest
import structlog

from aivedio.cli import common
from aivedio.cli import help as cli_help
from aivedio.cli import main as cli

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = cli_help.commands(cli.build_parser())


@pytest.fixture(autouse=True)
def _logging_put_back() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)  # a command configures logging for the whole process


def test_version_prints_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"aivedio {version('aivedio')}"


def test_the_commands_are_all_found() -> None:
    assert {"migrate", "jobs list", "assets show", "status", "ledger", "sweep"} <= set(COMMANDS)
    assert len(COMMANDS) == len(cli_help.EXAMPLES)


@pytest.mark.parametrize("words", sorted(COMMANDS))
def test_every_argument_of_every_command_has_help_text(words: str) -> None:
    missing = [
        action.option_strings[0] if action.option_strings else action.dest
        for action in COMMANDS[words]._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == [], f"aivedio {words}: no help for {missing}"


@pytest.mark.parametrize("words", sorted(COMMANDS))
def test_every_command_help_shows_one_example_and_the_exit_statuses(words: str) -> None:
    text = COMMANDS[words].format_help()
    example = text.split("example:\n", 1)[1].split("\n\n", 1)[0]
    assert example.strip().startswith(f"aivedio {words}")
    assert len(example.strip().splitlines()) == 1
    assert "exit status:" in text and "130" in text


def test_the_descriptions_are_plain_text_not_restructured_text() -> None:
    parser = cli.build_parser()
    texts = [parser.description or "", parser.format_help()]
    texts += [c.description or "" for c in COMMANDS.values()]
    for text in texts:
        assert "``" not in text and not re.search(r":\w+:`", text), text
    assert parser.description and parser.description[0].isupper()


def test_one_number_means_one_thing_and_every_status_is_in_the_table() -> None:
    codes = [code for code, _ in common.EXIT_STATUSES]
    assert len(codes) == len(set(codes))
    defined = {v for k, v in vars(common).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert defined == set(codes)


def test_the_readme_shows_the_same_exit_status_table() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| *`?(\d+)`? *\| *(.+?) *\|$", readme, flags=re.MULTILINE))
    assert {int(k): v for k, v in rows.items()} == dict(common.EXIT_STATUSES)


def test_config_check_runs_without_the_url_encryption_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AIVEDIO_URL_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("AIVEDIO_CONFIG", raising=False)
    assert cli.main(["config", "check"]) == common.EXIT_OK
    assert '"url_encryption_key"' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (
            ["ingest", "--provider", "p", "--task-id", "t", "--url", "https://x/", "--tenant", "a"],
            "encrypts the output's URL",
        ),
        (["worker"], "decrypts the provider URLs"),
        (["api"], "encrypts the URLs that provider callbacks carry"),
        (["watch", "--provider", "p", "--task-id", "t", "--tenant", "a"], "encrypts"),
    ],
)
def test_a_command_that_needs_the_key_names_it_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    why: str,
) -> None:
    monkeypatch.delenv("AIVEDIO_URL_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("AIVEDIO_CONFIG", raising=False)
    assert cli.main(argv) == common.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"aivedio {argv[0]}: needs the URL encryption key" in err
    assert "AIVEDIO_URL_ENCRYPTION_KEY" in err and why in err


def test_a_malformed_key_is_refused_even_by_a_command_that_does_not_need_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AIVEDIO_URL_ENCRYPTION_KEY", "not base64!")
    monkeypatch.delenv("AIVEDIO_CONFIG", raising=False)
    assert cli.main(["config", "check"]) == common.EXIT_USAGE
    assert "not valid base64" in capsys.readouterr().err


def test_the_table_aligns_numbers_right_and_text_left() -> None:
    at = datetime(2026, 12, 7, 10, 0, 0, 123456, tzinfo=UTC)
    rows = [
        {"id": 7, "kind": "fetch", "at": at, "error": None},
        {"id": 1234, "kind": "render_hls", "at": None, "error": "timeout"},
    ]
    assert common.table(rows, ("id", "kind", "at", "error")).splitlines() == [
        "id    kind        at                         error",
        "   7  fetch       2026-12-07T10:00:00+00:00  -",
        "1234  render_hls  -                          timeout",
    ]


def test_a_column_without_values_is_text_not_numbers() -> None:
    rows = [{"id": 1, "error": None}, {"id": 22, "error": None}]
    assert common.table(rows, ("id", "error")).splitlines() == [
        "id  error",
        " 1  -",
        "22  -",
    ]


def test_an_empty_table_says_so_under_its_header() -> None:
    assert common.table([], ("id", "kind")) == "id  kind\n(none)"


def test_a_listing_prints_every_field_as_json_lines_with_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [{"id": 1, "kind": "fetch", "hidden": "x"}]
    common.emit(rows, ("id", "kind"), as_json=True)
    assert capsys.readouterr().out == '{"id": 1, "kind": "fetch", "hidden": "x"}\n'
    common.emit(rows, ("id", "kind"), as_json=False)
    assert capsys.readouterr().out == "id  kind\n 1  fetch\n"
