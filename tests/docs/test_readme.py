"""The README is a front door that stays true: short, every link resolves, and every command shown in its
first two code blocks still parses (Hydra overrides compose against ``conf/``, extras exist, Python parses).

Links are checked in the README and in every ``docs/*.md`` page: a relative link must name an existing file,
and a ``#fragment`` must be the GitHub anchor of a heading of the target page (lower-case, punctuation
dropped, spaces to hyphens).
"""
from __future__ import annotations

import ast
import pathlib
import re
import shlex
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(\w*)")
MAX_README_LINES = 250


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block, in order."""
    blocks, fence, info, body = [], None, "", []
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence, info, body = m.group(1), m.group(2), []
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            blocks.append((info, "\n".join(body)))
            fence = None
        elif fence is not None:
            body.append(line)
    return blocks


def prose(text: str) -> str:
    """The text outside fenced code blocks (links inside code are not links)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0]:
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)


def anchors(path: pathlib.Path) -> set[str]:
    """GitHub's anchors of the headings of a Markdown page."""
    out = set()
    for line in prose(path.read_text()).splitlines():
        m = re.match(r"^ {0,3}#{1,6} +(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a shell block, split like a shell (comments dropped, ``&&`` chains split)."""
    joined = body.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        cmd = []
        for w in words:
            if w == "&&":
                commands.append(cmd)
                cmd = []
            else:
                cmd.append(w)
        if cmd:
            commands.append(cmd)
    return commands


def test_the_readme_is_a_short_front_door():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move reference material to docs/ (<= {MAX_README_LINES})"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for m in LINK.finditer(prose(page.read_text())):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z]+:", target):  # https:, mailto: - not checked offline
            continue
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(target)
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def _first_two_blocks():
    return code_blocks(README.read_text())[:2]


def test_the_first_two_code_blocks_are_shell_commands():
    blocks = _first_two_blocks()
    assert len(blocks) == 2 and all(info == "bash" for info, _ in blocks)


def test_every_command_of_the_first_two_blocks_still_parses():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dppo import make_config

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    parser = OverridesParser.create()
    seen = set()
    for _, body in _first_two_blocks():
        for cmd in shell_commands(body):
            seen.add(cmd[0] if cmd[0] != "python" else " ".join(cmd[:2]))
            if cmd[:2] == ["python", "train.py"]:
                args = cmd[2:]
                multirun = "-m" in args
                overrides = [a for a in args if a != "-m"]
                parser.parse_overrides(overrides)  # the grammar (sweeps included)
                if not multirun and not any(a.startswith("resume=") for a in overrides):
                    make_config(overrides)          # composes against conf/ and the typed schema
            elif cmd[:3] == ["python", "-m", "dppo.evaluate"]:
                from dppo.evaluate import build_parser

                build_parser().parse_args(cmd[3:])
            elif cmd[:3] == ["python", "-m", "dppo.plot"]:
                from dppo.plot import build_parser as plot_parser

                plot_parser().parse_args(cmd[3:])
            elif cmd[:2] == ["pip", "install"]:
                for spec in cmd[2:]:
                    m = re.match(r"^-e$|^\.\[(.*)\]$", spec)
                    if spec.startswith(".["):
                        assert set(m.group(1).split(",")) <= extras, f"unknown extra in {spec}"
            else:
                assert cmd[0] in ("pytest", "tensorboard", "pip"), f"unexpected command {cmd}"
    assert {"pip", "python train.py", "pytest"} <= seen


def test_every_python_block_of_the_readme_parses():
    for info, body in code_blocks(README.read_text()):
        if info == "python":
            ast.parse(body)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_speaks_of_issues_or_of_files_outside_the_repository(page):
    text = page.read_text()
    for needle in (r"\bissues?\b", r"\.\./shared", r"\bREFERENCE\.md\b", r"\bSTYLE\.md\b", r"\bseeds/"):
        assert not re.search(needle, text, flags=re.I), f"{page.name}: '{needle}' (a reader has only the repository)"
