"""What ``aivedio --help`` says beyond the options: the description, one example a command,
and the exit statuses (from ``cli/common.py``), attached to every command once the parser is
built, so a command added anywhere gets them and a test finds any command without one."""

from __future__ import annotations

import argparse

from aivedio.cli.common import exit_status_help

DESCRIPTION = (
    "Turn AI providers' video outputs and users' uploads into published assets:\n"
    "run the API and the workers, and inspect, replay and repair what they do."
)

# One example a command, shown at the end of its --help (a test holds every command to it).
EXAMPLES = {
    "migrate": "aivedio migrate --config /etc/aivedio/aivedio.toml",
    "webhooks deliveries list": "aivedio webhooks deliveries list --state dead --json",
    "webhooks deliveries retry": "aivedio webhooks deliveries retry --all-dead --endpoint crm",
    "worker": "aivedio worker --http-port 9100",
    "config check": "aivedio config check --config /etc/aivedio/aivedio.toml",
    "jobs list": "aivedio jobs list --status dead --limit 20",
    "jobs retry": "aivedio jobs retry 4211",
    "jobs enqueue": "aivedio jobs enqueue diag.sleep --count 10 --payload '{\"seconds\": 1}'",
    "ingest": (
        "aivedio ingest --provider sim --task-id t-1 --tenant demo "
        "--url 'https://cdn.example/t-1.mp4?sig=…' --expires-at 2026-12-01T10:00:00Z"
    ),
    "fetch": "aivedio fetch --dry-run https://cdn.example/t-1.mp4",
    "outputs list": "aivedio outputs list --status RETRY_WAIT",
    "tenants create": "aivedio tenants create acme",
    "api": "aivedio api --port 8080",
    "keys create": "aivedio keys create --tenant acme",
    "keys revoke": "aivedio keys revoke av_live_3f9c",
    "probe": "aivedio probe clip.mp4 --expect-resolution 1280x720",
    "process": "aivedio process clip.mp4 --out /tmp/clip --only playback,poster",
    "assets list": "aivedio assets list --status PROCESSING_FAILED",
    "assets show": "aivedio assets show 1234fa64-63b0-431f-8ee3-e3a289a6e8fc",
    "delete": "aivedio delete 1234fa64-63b0-431f-8ee3-e3a289a6e8fc --reason takedown",
    "cancel": "aivedio cancel --provider sim --task-id t-1",
    "reprocess": "aivedio reprocess 1234fa64-63b0-431f-8ee3-e3a289a6e8fc",
    "moderate": "aivedio moderate 1234fa64-63b0-431f-8ee3-e3a289a6e8fc --allow --reason ok",
    "status": "aivedio status --follow 1234fa64-63b0-431f-8ee3-e3a289a6e8fc",
    "ledger": "aivedio ledger --tenant acme --since 2026-12-01",
    "sweep": "aivedio sweep --dry-run",
    "watch": "aivedio watch --provider sim --task-id t-1 --tenant acme",
}


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aivedio")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command that runs (not the groups), by its words: ``{"jobs list": parser}``."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(node: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        groups = [a for a in node._actions if isinstance(a, argparse._SubParsersAction)]
        if not groups:
            found[" ".join(words)] = node
            return
        for name, child in groups[0].choices.items():
            walk(child, (*words, name))

    walk(parser, ())
    return found


def finish(parser: argparse.ArgumentParser) -> None:
    """Each command's help: its one-line summary as the description, then its example and
    the exit statuses."""
    for words, command in commands(parser).items():
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        summary = _summary(parser, words)
        if summary and not command.description:
            command.description = summary[0].upper() + summary[1:] + "."
        example = EXAMPLES.get(words)
        command.epilog = (f"example:\n  {example}\n\n" if example else "") + exit_status_help()


def _summary(parser: argparse.ArgumentParser, words: str) -> str | None:
    node = parser
    summary = None
    for word in words.split():
        group = next(a for a in node._actions if isinstance(a, argparse._SubParsersAction))
        summary = next((a.help for a in group._choices_actions if a.dest == word), None)
        node = group.choices[word]
    return summary
