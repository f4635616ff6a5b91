"""``validate_key``'s one-regex fast path accepts exactly the keys its rules accept."""

from __future__ import annotations

import itertools

import pytest

from aivedio.store.objects.base import KEY_CHARACTERS, MAX_KEY_BYTES, InvalidKeyError, validate_key


def follows_the_rules(key: str) -> bool:
    """The documented rules, one by one."""
    return (
        0 < len(key) <= MAX_KEY_BYTES
        and all(c in KEY_CHARACTERS for c in key)
        and all(segment and not segment.startswith(".") for segment in key.split("/"))
    )


def accepted(key: str) -> bool:
    try:
        assert validate_key(key) == key
    except InvalidKeyError:
        return False
    return True


def test_every_short_key_over_the_characters_that_matter_is_judged_by_the_rules() -> None:
    # The separators, a dot, the backslash, space and DEL (each side of the visible range),
    # a newline (which a "$" would let through), a non-ASCII letter, and ordinary characters.
    alphabet = "a/.\\ \x7f\n\u00e9~!-0[]_"
    judged = 0
    for length in range(5):
        for chars in itertools.product(alphabet, repeat=length):
            key = "".join(chars)
            assert accepted(key) == follows_the_rules(key), repr(key)
            judged += 1
    assert judged == sum(len(alphabet) ** n for n in range(5))


@pytest.mark.parametrize("code", range(0x100))
def test_each_character_alone_and_after_a_letter(code: int) -> None:
    char = chr(code)
    assert accepted("a" + char) == (char in KEY_CHARACTERS and char != "/")
    assert accepted(char) == (char in KEY_CHARACTERS and char not in "/.")
    assert accepted(f"x/{char}y") == (char in KEY_CHARACTERS and char not in "/.")


def test_the_length_limit() -> None:
    assert accepted("a" * MAX_KEY_BYTES)
    with pytest.raises(InvalidKeyError, match="longer than"):
        validate_key("a" * (MAX_KEY_BYTES + 1))


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("a//b", "empty path segment"),
        ("a/.b", "starts with '.'"),
        ("/a", "must not start"),
        ("a\\b", "visible ASCII"),
        ("", "non-empty"),
    ],
)
def test_a_refused_key_says_which_rule_it_breaks(key: str, says: str) -> None:
    with pytest.raises(InvalidKeyError, match=says):
        validate_key(key)
