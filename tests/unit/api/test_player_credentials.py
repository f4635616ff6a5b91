"""The watch page's Content Credentials badge: what it says, and that a manifest's text
(untrusted: any provider or attacker writes it) is escaped into the page."""

from __future__ import annotations

import uuid

import anyio

from aivedio.api import player
from aivedio.pipeline.media.credentials import content_credentials


def test_the_badge_says_ai_generated_who_signed_and_that_the_platform_signed() -> None:
    found = content_credentials(
        {
            "present": True,
            "state": "trusted",
            "signer_subject": "Example <b>Video</b> Provider",
            "signer_issuer": "Example CA",
            "digital_source_type": "trainedAlgorithmicMedia",
            "ai_generated": True,
            "claim_generator": "example-provider 1.0",
        },
        {"playback": {"signed": True, "signer": "aivedio platform"}},
    )
    badge = player.credentials_html(found)
    assert badge.startswith('<details class="credentials ai" id="player-credentials">')
    assert "Content Credentials</summary>" in badge
    assert "<dt>AI-generated</dt><dd>yes (trainedAlgorithmicMedia)</dd>" in badge
    assert "Example &lt;b&gt;Video&lt;/b&gt; Provider (issued by Example CA)" in badge
    assert "<b>" not in badge
    assert "verified, trusted signer" in badge
    assert "<dt>Published files signed by</dt><dd>aivedio platform</dd>" in badge
    assert player.credentials_html(None) == ""


def test_the_page_carries_the_badge_after_the_player() -> None:
    found = content_credentials({"present": False, "state": "absent"}, {})
    page = anyio.run(
        lambda: player.render_page(uuid.uuid4(), 1, "tok", {}, found)  # no media published
    )
    assert 'id="player-credentials"' in page
    assert "<dt>Source manifest</dt><dd>none</dd>" in page
    assert page.index('id="player-status"') < page.index('id="player-credentials"')
