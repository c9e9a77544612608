"""The map of the package: every module imports, every ``from dppo... import name`` resolves, and the imports
follow the layers of docs/architecture.md (no import circle, no import from a lower layer to a higher one)."""
from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import dppo

ROOT = Path(dppo.__file__).resolve().parent

# docs/architecture.md, "The layers", bottom up: a module imports only from its own package and the ones before
ORDER = ["dppo.errors", "dppo.data", "dppo.privacy", "dppo.policies", "dppo.envs", "dppo.function_classes",
         "dppo.oracles", "dppo.algos", "dppo.training", "dppo.audit", "dppo.config", "dppo.build", "dppo.api",
         "dppo.saved_run", "dppo.cli", "dppo.evaluate", "dppo.plot", "dppo"]
# names still imported by a module another change rewrites (the video evaluation of dppo/evaluate.py)
PENDING = {("dppo.evaluate", "dppo.algos.npg", "evaluation_seeds")}


def modules() -> list[str]:
    return ["dppo"] + sorted(m.name for m in pkgutil.walk_packages(dppo.__path__, "dppo."))


def source(name: str) -> Path:
    rel = name.split(".")[1:]
    pkg = ROOT.joinpath(*rel)
    return pkg / "__init__.py" if pkg.is_dir() else pkg.with_suffix(".py")


def dppo_imports(name: str) -> list[tuple[str, list[str]]]:
    """(module imported, names taken) for every ``import dppo...`` / ``from dppo... import ...`` in the module,
    at any depth (function-level imports included)."""
    out = []
    for node in ast.walk(ast.parse(source(name).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                (node.module == "dppo" or node.module.startswith("dppo.")):
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name == "dppo" or a.name.startswith("dppo.")]
    return out


def room(name: str) -> str:
    """The package (or top-level module) of ``name``: ``dppo.algos.npg`` -> ``dppo.algos``."""
    parts = name.split(".")
    return ".".join(parts[:2])


@pytest.mark.parametrize("name", modules())
def test_every_module_imports(name):
    importlib.import_module(name)


def test_every_dppo_import_resolves():
    missing = []
    for name in modules():
        for target, names in dppo_imports(name):
            mod = importlib.import_module(target)
            for n in names:
                if not hasattr(mod, n):
                    try:
                        importlib.import_module(f"{target}.{n}")  # a submodule
                    except ImportError:
                        if (name, target, n) not in PENDING:
                            missing.append(f"{name}: from {target} import {n}")
    assert not missing, missing


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    assert set(map(room, modules())) <= set(ORDER), set(map(room, modules())) - set(ORDER)
    upward = [f"{name} -> {target}" for name in modules() for target, _ in dppo_imports(name)
              if room(target) != room(name) and ORDER.index(room(target)) > ORDER.index(room(name))]
    assert not upward, upward


def test_no_import_circle():
    """Between modules (within a package too), counting imports inside functions."""
    graph = {name: {t for t, _ in dppo_imports(name) if t != name} for name in modules()}
    graph = {n: {t if t in graph else t.rsplit(".", 1)[0] for t in ts} for n, ts in graph.items()}
    state, cycles = {}, []

    def visit(n, path):
        state[n] = "open"
        for t in sorted(graph.get(n, ())):
            if t == "dppo" or n == "dppo":  # the package face only hands names on
                continue
            if state.get(t) == "open":
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[n] = "done"

    for n in graph:
        if n not in state:
            visit(n, [n])
    assert not cycles, cycles
