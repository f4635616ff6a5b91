"""``store.together``: independent writes composed as the CTEs of one statement."""

from __future__ import annotations

import pytest

from aivedio.store.together import Part, require, together_sql


def test_parameters_are_renumbered_part_by_part_and_the_args_follow() -> None:
    sql, args = together_sql(
        {
            "first": Part("INSERT INTO a (x, y) VALUES ($1, $2) RETURNING 1", ("x", 1)),
            "second": Part("UPDATE b SET z = $2 WHERE id = $1 AND w = $1 RETURNING 1", (7, "z")),
            "third": Part("INSERT INTO c (v) VALUES ($1::text::jsonb) RETURNING id", ("{}",)),
        }
    )
    assert sql == (
        "WITH first AS (INSERT INTO a (x, y) VALUES ($1, $2) RETURNING 1),"
        " second AS (UPDATE b SET z = $4 WHERE id = $3 AND w = $3 RETURNING 1),"
        " third AS (INSERT INTO c (v) VALUES ($5::text::jsonb) RETURNING id)"
        " SELECT (SELECT count(*) FROM first) AS first, (SELECT count(*) FROM second) AS second,"
        " (SELECT count(*) FROM third) AS third"
    )
    assert args == ["x", 1, 7, "z", "{}"]


def test_a_part_with_a_value_answers_its_first_rows_column() -> None:
    sql, _ = together_sql({"a": Part("INSERT INTO t VALUES ($1) RETURNING id", (1,), value="id")})
    assert sql.endswith("SELECT (SELECT id FROM a LIMIT 1) AS a")


def test_parameter_numbers_past_nine_are_shifted_whole() -> None:
    sql, _ = together_sql(
        {
            "a": Part("SELECT $1 RETURNING 1", list(range(10))),
            "b": Part("SELECT $10, $1 RETURNING 1", list(range(10))),
        }
    )
    assert "b AS (SELECT $20, $11 RETURNING 1)" in sql


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({}, "no statements"),
        ({"x; DROP": Part("SELECT 1 RETURNING 1", ())}, "not a plain identifier"),
        ({"x": Part("INSERT INTO a VALUES (1)", ())}, "returns no rows"),
        ({"x": Part("SELECT 1", (), value="1; DROP")}, "not a plain column name"),
    ],
)
def test_bad_parts_are_refused(parts: dict[str, Part], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        together_sql(parts)


def test_a_requirement_answers_true_or_raises_its_own_code() -> None:
    part = require("(SELECT n = $1 FROM lock)", "AVP01", "moved", (3,))
    assert part.sql == "SELECT aivedio_require((SELECT n = $1 FROM lock), 'AVP01', $2) AS ok"
    assert tuple(part.args) == (3, "moved")
    # AVL01 is the lease check's; a code not of ours could hide a server's own error.
    for code in ("AVL01", "23505", "AVP1", "avp01", "AVP01'; --"):
        with pytest.raises(ValueError, match="not of the form"):
            require("true", code, "no")
