"""The README and docs render as intended: every code fence is closed and every section heading is a heading.

A CommonMark fenced block opens with a line of >= 3 backticks or tildes (up to 3 spaces of indent) and closes
with a line of the same character, at least as long, and nothing else; an unclosed fence swallows the rest
of the file. The check walks the lines with those rules, independently of any renderer.
"""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def rendered_headings(text: str) -> tuple[list[str], list[int]]:
    """(headings outside code blocks, line numbers of fences left open at the end)."""
    headings, open_fence, opened_at = [], None, None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if open_fence is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                open_fence, opened_at = m.group(1), n
            elif re.match(r"^ {0,3}#{1,6} ", line):
                headings.append(line.strip())
        elif m and m.group(1)[0] == open_fence[0] and len(m.group(1)) >= len(open_fence) and not m.group(2).strip():
            open_fence = None
    return headings, ([opened_at] if open_fence else [])


def source_headings(text: str) -> list[str]:
    """Lines that look like section headings (``## ...``) anywhere in the source, fenced or not (a shell
    comment in a code block starts with a single '#', so it is not one)."""
    return [ln.strip() for ln in text.splitlines() if re.match(r"^#{2,6} \S", ln)]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_code_fence_is_closed(path):
    _, unclosed = rendered_headings(path.read_text())
    assert not unclosed, f"{path.name}: the code fence opened on line {unclosed[0]} is never closed"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_section_heading_renders_as_a_heading(path):
    text = path.read_text()
    rendered, _ = rendered_headings(text)
    missing = [h for h in source_headings(text) if h not in rendered]
    assert not missing, f"{path.name}: these headings render inside a code block: {missing}"


def test_the_checker_catches_an_unclosed_fence():
    broken = "# T\n\n```bash\npython train.py\n\n## Configuration\n\ntext\n"
    rendered, unclosed = rendered_headings(broken)
    assert unclosed == [3] and "## Configuration" not in rendered
    fixed = broken.replace("train.py\n", "train.py\n```\n")
    rendered, unclosed = rendered_headings(fixed)
    assert unclosed == [] and "## Configuration" in rendered


def test_readme_sections_all_render():
    rendered, _ = rendered_headings((ROOT / "README.md").read_text())
    for h in ("## Quick start", "## Use a trained policy", "## Python API", "## Configuration in brief",
              "## The privacy model in one screen", "## Documentation", "## References", "## Development"):
        assert h in rendered
