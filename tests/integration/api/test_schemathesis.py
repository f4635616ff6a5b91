"""A full schemathesis run against the served /openapi.json, with every check it has: no
server errors, every response as the document says (status codes, content types, headers,
bodies), every request the document calls valid accepted and every invalid one refused, auth
never ignored, undeclared methods answered 405 with ``Allow``, and, in the stateful phase
that follows the document's links, what one answer creates found by the next request.

The API runs for real on loopback (real PostgreSQL, the local store) with a published asset
and providers that accept callbacks and watches; schemathesis's own CLI runs as a subprocess
with an API key, so it exercises authenticated routes too. Its reports are kept as artifacts.

What the schema cannot say is told to schemathesis per operation, never by leaving a check or
an operation out:

* ``PUT /v1/videos/{id}/upload`` keeps only the bytes ``POST /v1/videos`` declared (size and
  SHA-256): a schema-valid body of other bytes is refused 422, as documented.
* ``POST /v1/generation-tasks`` names a provider: which ones are configured (and which task
  ids each issues) is this deployment's configuration, which the public document does not
  list, so a well-formed name of no configured provider is refused 422, as documented. The
  configured names are given as a dictionary, so the success path (and its link) runs too.
* ``GET``/``HEAD /media/{token}/{path}``: a well-formed ``Range`` past the object's end is
  416, as documented; the object's size is not the schema's to know.
* ``POST /v1/providers/{provider}/callbacks`` is checked like every operation, but its two
  warnings about never getting past the signature are not shown (why: ``UNSIGNABLE``).
* The event stream is endless by design: it is read up to its first event (or 2 s), so it
  is fuzzed with existing assets too instead of being left out of the second run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.support.schemathesis_run import DOCUMENT_WARNINGS, fuzzed_api, run_schemathesis, settings

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]


async def test_schemathesis_finds_no_conformance_failure_with_generated_parameters(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    # Every parameter generated (unknown ids, garbage tokens, hostile bodies), and the ids
    # that answers create followed through the document's links. The run with ids that
    # exist is test_schemathesis_existing.py.
    async with fuzzed_api(config, pool, tmp_path) as api:
        first = settings({}, fail_on=DOCUMENT_WARNINGS)  # unknown ids: 404s are the point
        await run_schemathesis(api.base, api.key, "generated", tmp_path, first)
