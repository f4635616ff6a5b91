"""Diagnostic job kinds for operators and checks: prove a fleet claims, runs and retries.

``diag.noop`` does nothing; ``diag.sleep`` sleeps ``payload["seconds"]`` (on later attempts
``payload["retry_seconds"]`` when given: a job that hangs once); ``diag.fail`` raises
the error class named in its payload (with an optional ``retry_after``). When
``[diagnostics] execution_journal_dir`` is set, every execution appends ``job_id token``
to a per-process journal there, so a check can count executions per job id.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TextIO

import anyio

from aivedio import errors
from aivedio.pipeline import jobs
from aivedio.pipeline.jobs import JobContext, Registry
from aivedio.store.queue import Job

LANE = "control"


class Journal:
    """Append-only record of executions, one line per run, flushed at every line."""

    def __init__(self, directory: str) -> None:
        self._file: TextIO | None = None
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self._file = open(  # noqa: SIM115 - lives as long as the worker
                Path(directory) / f"executions-{os.getpid()}.log", "a", encoding="ascii"
            )

    def record(self, job: Job) -> None:
        if self._file is not None:
            self._file.write(f"{job.id} {job.lease_token}\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _journal(ctx: JobContext) -> Journal | None:
    journal = ctx.services.get("journal")
    return journal if isinstance(journal, Journal) else None


async def noop(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    if journal := _journal(ctx):
        journal.record(job)
    return None


async def sleep(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    seconds = job.payload.get("seconds", 1.0)
    if job.attempts > 1:
        seconds = job.payload.get("retry_seconds", seconds)
    await anyio.sleep(float(seconds))
    if journal := _journal(ctx):
        journal.record(job)
    return {"slept": seconds}


_FAILURES: dict[str, type[errors.AivedioError]] = {
    cls.error_class: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.AivedioError)
}


async def fail(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    if journal := _journal(ctx):
        journal.record(job)
    until = int(job.payload.get("fail_attempts", 1_000_000))
    if job.attempts > until:
        return {"recovered_at_attempt": job.attempts}
    cls = _FAILURES.get(str(job.payload.get("error_class", "transient")), errors.TransientError)
    retry_after = job.payload.get("retry_after")
    raise cls("diagnostic failure", retry_after_seconds=retry_after)


def register(registry: Registry) -> None:
    registry.bind(jobs.DIAG_NOOP, noop)
    registry.bind(jobs.DIAG_SLEEP, sleep)
    registry.bind(jobs.DIAG_FAIL, fail)
