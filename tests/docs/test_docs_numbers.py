"""The numbers in the docs are the ones the scripts wrote under ``runs/reference/``, and the docs agree with
each other on what a user is.

* A table in README.md or docs/*.md whose header is the header of a table in a ``runs/reference/*.md`` file
  is a copy of (part of) that table: every row appears there verbatim.
* The README's suite summary and its "which learner" table quote final returns of ``runs/reference/suite.md``:
  every number in those cells is the "final return (mean)" of a row of the same env's section.
* The definition of a user is one sentence, the same in the README and in docs/privacy.md.
"""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
REFERENCE = sorted((ROOT / "runs" / "reference").glob("*.md"))
RULE = re.compile(r"^\|[-| :]+\|$")


def tables(text: str) -> list[tuple[str, list[str]]]:
    """(header line, data rows) of every Markdown table of a page."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and RULE.match(lines[i + 1]) and (i == 0 or not lines[i - 1].startswith("|")):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(row)
            out.append((line, rows))
    return out


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _reference_tables() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in REFERENCE:
        for header, rows in tables(path.read_text()):
            out.setdefault(header, set()).update(rows)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_table_with_a_reference_tables_header_copies_its_rows_verbatim(page):
    reference = _reference_tables()
    copied = [(h, rows) for h, rows in tables(page.read_text()) if h in reference]
    stale = [row for h, rows in copied for row in rows if row not in reference[h]]
    assert not stale, f"{page.name}: rows not in runs/reference (regenerate, or copy the script's table): {stale}"


def _suite_returns() -> dict[str, set[float]]:
    """Per env heading of runs/reference/suite.md: the final returns (mean) of its rows."""
    text = (ROOT / "runs" / "reference" / "suite.md").read_text()
    out: dict[str, set[float]] = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        env = section.splitlines()[0].strip()
        for header, rows in tables(section):
            col = cells(header).index("final return (mean)")
            out.setdefault(env, set()).update(float(cells(r)[col]) for r in rows)
    return out


def _readme_table(first_header_cell: str) -> list[list[str]]:
    for header, rows in tables(README.read_text()):
        if cells(header)[0] == first_header_cell:
            return [cells(r) for r in rows]
    raise AssertionError(f"the README has no table starting with '{first_header_cell}'")


def test_the_readmes_suite_summary_quotes_the_suites_final_returns():
    suite = _suite_returns()
    env, checked = None, 0
    for row in _readme_table("env"):
        env = row[0] or env
        for number in re.findall(r"-?\d+\.\d+", row[3]):
            assert float(number) in suite[env], f"README suite row {row}: {number} is not a final return of {env}"
            checked += 1
    assert checked >= 20


def _definition(path: pathlib.Path) -> str:
    text = " ".join(path.read_text().split())
    m = re.search(r"\*\*Who is protected\*\*: (a \*user\* is .*?\(tabular learners\)\.)", text)
    assert m, f"{path.name} has no definition of a user"
    return m.group(1)


def test_a_user_is_defined_once_the_same_in_the_readme_and_the_privacy_model():
    assert _definition(README) == _definition(ROOT / "docs" / "privacy.md")
    for page in PAGES:
        text = " ".join(page.read_text().split())
        assert "one episode stream of an environment" not in text, page.name
