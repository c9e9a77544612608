"""The numbers in the docs are the ones the scripts wrote under ``runs/reference/``, and the docs agree with
each other on what a user is.

* A table in README.md or docs/*.md whose header is the header of a table in a ``runs/reference/*.md`` file
  is a copy of (part of) that table: every row appears there verbatim.
* The README's "which learner" table quotes final returns of ``runs/reference/suite.md``: every number in its
  return cells is the "final return (mean)" of a row of the same env's section.
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


def test_the_readmes_which_learner_table_quotes_the_suites_final_returns():
    """Every number of the eps 5, eps 1 and best non-private cells of a row naming a suite env is a final
    return of that env's section of runs/reference/suite.md; every suite env has a row."""
    suite = _suite_returns()
    checked, envs = 0, set()
    for row in _readme_table("your problem (suite env)"):
        env = re.search(r"\(([\w-]+-v\d+)\)", row[0])
        if env is None:
            continue
        envs.add(env.group(1))
        for cell in row[2:5]:
            for number in re.findall(r"-?\d+\.\d+", cell):
                assert float(number) in suite[env.group(1)], f"README row {row}: {number} is not a final return"
                checked += 1
    assert envs == set(suite) and checked >= 12


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


def _default_command() -> dict:
    """runs/reference/default_command.md (``scripts/seed_sweep.py`` on the default command): finals and times."""
    text = (ROOT / "runs" / "reference" / "default_command.md").read_text()
    rows = re.findall(r"^seed=\d+ final=([\d.]+) .* t=([\d.]+)s train=([\d.]+)s$", text, flags=re.M)
    mean = float(re.search(r"mean ([\d.]+)", text).group(1))
    return {"final": [float(r[0]) for r in rows], "t": [float(r[1]) for r in rows],
            "train": [float(r[2]) for r in rows], "mean": mean, "seeds": len(rows)}


def test_the_default_commands_figures_in_the_readme_and_suite_page_are_the_sweeps():
    import math

    run = _default_command()
    assert run["seeds"] == 10 and min(run["final"]) >= 450      # the first-hour bar: every seed of ten
    readme = " ".join(README.read_text().split())
    assert (f"ends at {min(run['final']):.1f}-{max(run['final']):.1f} on seeds 0-9 (mean {run['mean']:.1f}), "
            f"{min(run['train']):.1f}-{max(run['train']):.1f} s of training") in readme
    assert f"{math.floor(min(run['t']))}-{math.ceil(max(run['t']))} s on one core" in readme
    suite = " ".join((ROOT / "docs" / "suite.md").read_text().split())
    assert (f"min {min(run['final']):.1f}, mean {run['mean']:.1f}; {min(run['train']):.1f}-{max(run['train']):.1f} s "
            f"of training a run") in suite


def test_the_default_learner_is_the_one_the_comparison_of_defaults_names():
    text = (ROOT / "runs" / "reference" / "default_learner.md").read_text()
    chosen = re.search(r"^default: algo=(\w+)", text, flags=re.M).group(1)
    config = (ROOT / "conf" / "config.yaml").read_text()
    assert re.search(rf"^\s+- algo: {chosen}\b", config, flags=re.M), "conf/config.yaml's default algo"
    header = cells(next(line for line in text.splitlines() if line.startswith("| env |")))
    scores = dict(zip(header[3:], re.findall(r"\*\*([\d.-]+)\*\*", text)))
    readme = " ".join(README.read_text().split())
    assert (f"DP-NPG's defaults score **{scores['dp_npg']}** against DP-PPO's **{scores['dp_ppo']}**") in readme
