"""The scripts' import rule: a script imports no other script, only the shared helper module
(``scripts/common.py``), and only its public names; the helper imports no script (so no import circle can form
in ``scripts/``). And every script still answers ``--help`` (one child process runs them all)."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
HELPERS = {"common"}                          # the modules of scripts/ a script may import
NAMES = sorted(p.stem for p in SCRIPTS.glob("*.py"))
PROGRAMS = [n for n in NAMES if n not in HELPERS]


def imported(name: str) -> list[tuple[str, list[str]]]:
    """(module of scripts/ imported, names taken) for every import in ``scripts/<name>.py`` at any depth:
    ``import x``, ``from x import ...``, ``scripts.x``, ``importlib.import_module('x')``, and a module loaded
    from ``scripts/x.py`` by path."""
    out = []
    for node in ast.walk(ast.parse((SCRIPTS / f"{name}.py").read_text())):
        mods = []
        if isinstance(node, ast.Import):
            mods = [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods = [(node.module, [a.name for a in node.names])]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[-1], ast.Constant) \
                and isinstance(node.args[-1].value, str):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            value = node.args[-1].value
            if func == "import_module":
                mods = [(value, [])]
            elif func == "spec_from_file_location" and value.endswith(".py"):
                mods = [(Path(value).stem, [])]
        for mod, names in mods:
            mod = mod.removeprefix("scripts.")
            if mod in NAMES:
                out.append((mod, names))
    return out


def test_the_scripts_are_found():
    assert "reproduce_cartpole" in PROGRAMS and "secure_spread" in PROGRAMS and HELPERS <= set(NAMES)


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_script_imports_no_other_script_only_the_helper(name):
    others = sorted({mod for mod, _ in imported(name) if mod not in HELPERS})
    assert not others, f"scripts/{name}.py imports the script(s) {others}: move what they share to scripts/common.py"


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_the_helper_imports_no_script(name):
    assert not imported(name), f"scripts/{name}.py imports {imported(name)}: the helper must import no script"


def test_only_public_names_that_the_helper_defines_are_imported_from_it():
    defined = {}
    for helper in HELPERS:
        tree = ast.parse((SCRIPTS / f"{helper}.py").read_text())
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        defined[helper] = names
    bad = [f"{name}: from {mod} import {n}" for name in PROGRAMS for mod, names in imported(name)
           for n in names if n.startswith("_") or n not in defined[mod]]
    assert not bad, bad


def test_the_rule_catches_an_import_of_another_script(tmp_path, monkeypatch):
    """The checker itself: a script importing another one (at any depth, or by path) is reported."""
    fake = tmp_path / "scripts"
    fake.mkdir()
    (fake / "common.py").write_text("X = 1\n")
    (fake / "a.py").write_text("def f():\n    import b\n    from common import X\n")
    (fake / "b.py").write_text("import importlib.util\nimportlib.util.spec_from_file_location('a', 'scripts/a.py')\n")
    monkeypatch.setattr(sys.modules[__name__], "SCRIPTS", fake)
    monkeypatch.setattr(sys.modules[__name__], "NAMES", ["a", "b", "common"])
    assert imported("a") == [("b", []), ("common", ["X"])]
    assert imported("b") == [("a", [])]


CHILD = """
import contextlib, io, json, runpy, sys, warnings
warnings.filterwarnings("ignore")
for path in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [path, "--help"]
    code = "returned"
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) or e.code is None else 1
    except BaseException as e:
        code = f"{type(e).__name__}: {e}"
    print(json.dumps({"path": path, "code": code, "usage": "usage:" in out.getvalue()}), file=sys.__stdout__,
          flush=True)
"""


@pytest.fixture(scope="module")
def helps():
    """Every script's ``--help``, run in one child process (one interpreter start for them all)."""
    paths = [str(SCRIPTS / f"{n}.py") for n in PROGRAMS]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", CHILD, *paths], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{"path"')]
    return {Path(r["path"]).stem: r for r in lines}


@pytest.mark.parametrize("name", PROGRAMS)
def test_every_script_answers_help(helps, name):
    assert name in helps, f"scripts/{name}.py --help did not report (the child stopped before it)"
    assert helps[name]["code"] in (0, None) and helps[name]["usage"], helps[name]
