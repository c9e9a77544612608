"""docs/architecture.md agrees with the code: its layer list is the import rule's ``ORDER`` of
tests/test_imports.py (read from that file, not imported), and every ``dppo/...`` path it names exists."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def import_rule_order() -> list[str]:
    """``ORDER`` as tests/test_imports.py assigns it (a literal list)."""
    tree = ast.parse((ROOT / "tests" / "test_imports.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ORDER" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("tests/test_imports.py assigns no ORDER")


def module_of(path: str) -> str:
    """``dppo/errors.py`` -> ``dppo.errors``, ``dppo/data/`` -> ``dppo.data``, ``dppo/__init__.py`` -> ``dppo``."""
    path = path.rstrip("/").removesuffix("/__init__.py").removesuffix(".py")
    return path.replace("/", ".")


def doc_layers(text: str) -> list[tuple[int, str]]:
    """(number, module) of each entry of the first code block of the section "The layers"."""
    section = ("\n" + text).split("\n## The layers", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    return [(int(m.group(1)), module_of(m.group(2)))
            for m in re.finditer(r"^\s*(\d+)\s+(dppo\S*)", block, flags=re.M)]


def test_the_layer_list_is_the_import_rules_order():
    layers = doc_layers(DOC.read_text())
    assert [n for n, _ in layers] == list(range(1, len(layers) + 1)), "the layers are numbered 1, 2, 3, ..."
    assert [m for _, m in layers] == import_rule_order()


def test_the_parser_reads_a_layer_list_and_notices_a_swap():
    text = "## The layers\n\n```\n 1  dppo/errors.py   x\n 2  dppo/data/   y\n      continued\n 3  dppo/__init__.py\n```\n"
    assert doc_layers(text) == [(1, "dppo.errors"), (2, "dppo.data"), (3, "dppo")]
    swapped = text.replace("dppo/errors.py", "dppo/tmp").replace("dppo/data/", "dppo/errors.py").replace(
        "dppo/tmp", "dppo/data/")
    assert [m for _, m in doc_layers(swapped)] != [m for _, m in doc_layers(text)]


def test_every_dppo_path_the_page_names_exists():
    """A file named ``dppo/x/y.py`` may also have become the package ``dppo/x/y/``."""
    names = set(re.findall(r"\bdppo/[\w/]*(?:\.py|/)", DOC.read_text()))
    missing = [n for n in sorted(names) if not (ROOT / n).exists() and not (ROOT / n.removesuffix(".py")).is_dir()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
