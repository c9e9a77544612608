"""Nothing in a shareable file is a function of private data except the released outputs (docs/privacy.md,
"What a shareable file may depend on"), tested as DP is defined: for each kind of population, two runs with
seeded noise on *neighbouring* data (one private user or row replaced) must write shareable files
(summary.json, policy.pt and its config, .hydra/, the adapter folder, and with ``logger.diagnostics=false``
the TensorBoard events file and progress.csv) that are identical byte for byte once the released tensors and
the released metrics are masked. Both runs use the same paths (one run directory, moved away after each run,
and one data file rewritten between them), so the comparison needs no other mask. Each neighbour runs in a
Python process of its own, with its own hash seed (PYTHONHASHSEED 1 and 2): a file that depends on the process
(a dict or set iterated in hash order, a protobuf map written in its hash table's order) differs between them.

The released values masked (everything else must match exactly):
* tensors: the policy's (and a critic's) weights in policy.pt and in the adapter's safetensors;
* metrics that are functions of the released weights and public streams only: ``eval/*`` (the public
  evaluation), ``final_return`` / ``best_return``, ``policy_sha256`` and ``env_steps.public`` (the public
  evaluation's steps) in summary.json;
* noised statistics a learner releases through an accounted mechanism and functions of them (the trainer's
  classification, ``dppo.training.callbacks.RELEASED_PREFIXES``: ``losses/``, ``regret/``, ``counters/``,
  ``gfa/``); the accountant's ``privacy/*`` figures are public and are not masked.
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib
import json
import os
import runpy
import shutil
import struct
import subprocess
import sys
from unittest import mock

import pytest
import torch

import dppo
from dppo.envs.prompts import load_rows
from dppo.training.callbacks import RELEASED_PREFIXES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MASK = "<released>"
# summary.json's functions of released outputs: the public evaluation of the released policy, its hash, and
# a tabular learner's regret and gate fraction (functions of the released counters' policies and values)
RELEASED_SUMMARY = ("final_return", "final_greedy_return", "best_return", "policy_sha256", "cumulative_regret", "regret_at",
                    "gate_open_fraction")
# the trainer's own classification of released metrics, less the accountant's figures (public: never masked)
RELEASED_METRICS = tuple(p for p in RELEASED_PREFIXES if p != "privacy/")
# eps large enough that the released update is not shrunk to zero (the test needs the replaced user to matter)
QUIET = ["progress=false", "privacy.secure_rng=false", "logger.diagnostics=false", "eps=1000"]


# ---- reading a run's shareable files with the released values masked ------------------------------------
def _released_metric(tag: str) -> bool:
    return tag.startswith(RELEASED_METRICS)


def _mask_tensors(obj):
    if torch.is_tensor(obj):
        return f"{MASK} tensor{tuple(obj.shape)} {obj.dtype}"
    if isinstance(obj, dict):
        return {k: _mask_tensors(v) for k, v in obj.items()}
    return obj


def _policy_pt(path):
    saved = torch.load(path, weights_only=True)
    out = {k: v for k, v in saved.items() if k not in ("policy", "critic")}
    out.update({k: _mask_tensors(saved[k]) for k in ("policy", "critic") if k in saved})
    if isinstance(out.get("summary"), dict):   # summary.json's public part: the same released figures masked
        out["summary"] = {k: MASK if k in RELEASED_SUMMARY else v for k, v in out["summary"].items()}
    assert not any(torch.is_tensor(v) for v in out.values())
    return json.dumps(out, sort_keys=True, default=repr)


def _summary(path):
    s = json.load(open(path))
    for k in RELEASED_SUMMARY:
        if k in s:
            s[k] = MASK
    if isinstance(s.get("env_steps"), dict) and "public" in s["env_steps"]:
        s["env_steps"]["public"] = MASK
    return json.dumps(s, sort_keys=True)


def _progress(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    header = rows[0]
    masked = [[MASK if _released_metric(header[i]) and v else v for i, v in enumerate(r)] for r in rows[1:]]
    return json.dumps([header, *masked])


def _events(path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = []
    for e in EventFileLoader(path).Load():
        if e.HasField("summary"):
            for v in e.summary.value:
                if _released_metric(v.tag):
                    v.ClearField("simple_value")
                    v.ClearField("tensor")
        out.append(e.SerializeToString().hex())
    return json.dumps(out)


def _safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8:8 + n].decode() + f" {MASK} {len(raw) - 8 - n} bytes of tensors"


def shareable_view(run_dir: str) -> dict[str, str]:
    """Every shareable file of a run (relative path -> its content with the released values masked)."""
    view = {}
    for dirpath, _, files in os.walk(run_dir):
        rel_dir = os.path.relpath(dirpath, run_dir)
        top = rel_dir.split(os.sep)[0]
        for name in files:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            path = os.path.join(dirpath, name)
            if rel == "policy.pt":
                view[rel] = _policy_pt(path)
            elif rel == "summary.json":
                view[rel] = _summary(path)
            elif rel == "progress.csv":
                view[rel] = _progress(path)
            elif rel_dir == "." and "tfevents" in name:
                view[rel] = _events(path)
            elif top in ("adapter", "model") and name.endswith(".safetensors"):   # an LM run's HF folder
                view[rel] = _safetensors(path)
            elif top in (".hydra", "adapter", "model"):
                view[rel] = open(path, "rb").read().hex()
    return view


def differences(a: str, b: str) -> list[str]:
    va, vb = shareable_view(a), shareable_view(b)
    return sorted(set(va) ^ set(vb)) + sorted(k for k in set(va) & set(vb) if va[k] != vb[k])


def released_outputs_differ(a: str, b: str) -> bool:
    """Whether the replaced user reached the release at all (else the comparison would show nothing)."""
    def raw(d, name):
        path = os.path.join(d, name)
        return open(path, "rb").read() if os.path.isfile(path) else None
    return any(raw(a, name) != raw(b, name) for name in ("policy.pt", "summary.json"))


# ---- two runs on neighbouring data -------------------------------------------------------------------------
def _cli(overrides, run_dir):
    argv = list(__import__("sys").argv)
    __import__("sys").argv = ["train.py", *overrides, f"hydra.run.dir={run_dir}"]
    try:
        runpy.run_path(os.path.join(ROOT, "train.py"), run_name="__main__")
    except SystemExit as err:
        assert err.code in (0, None), f"train.py exited {err.code}"
    finally:
        __import__("sys").argv = argv


# the hash seed of each neighbour's process (different, so a hash-order dependence shows as a difference)
HASH_SEEDS = {"a": "1", "b": "2"}
MODULE = "tests.training.test_shareable_neighbours"


def run_worlds(world: str, base: str, *calls: str) -> None:
    """In this process, for each ``module:function`` of ``calls`` in turn: ``function(world, run_dir)`` in the one
    run directory ``base/run``, then moved to ``base/<function>/<world>``."""
    here = os.path.join(base, "run")
    for call in calls:
        module, function = call.split(":")
        getattr(importlib.import_module(module), function)(world, here)
        os.makedirs(os.path.join(base, function), exist_ok=True)
        shutil.move(here, os.path.join(base, function, world))


def neighbours_in_own_processes(base, *calls: str) -> dict[str, tuple[str, str]]:
    """World a's runs of ``calls`` (``run_worlds``) in one new Python process with PYTHONHASHSEED=1, then world
    b's in another with PYTHONHASHSEED=2; returns each function's two run directories (a, b)."""
    for world in ("a", "b"):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONHASHSEED=HASH_SEEDS[world])
        code = f"import sys; from {MODULE} import run_worlds; run_worlds(*sys.argv[1:])"
        r = subprocess.run([sys.executable, "-c", code, world, str(base), *calls], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"world {world} failed:\n{r.stderr[-3000:]}"
    names = [c.split(":")[1] for c in calls]
    return {n: (os.path.join(base, n, "a"), os.path.join(base, n, "b")) for n in names}


def neighbouring_runs(tmp_path, run, worlds=("a", "b")):
    """``run(world, run_dir)`` for each world, in this process, in one run directory moved away after each run."""
    here = str(tmp_path / "run")
    out = []
    for world in worlds:
        run(world, here)
        shutil.move(here, str(tmp_path / world))
        out.append(str(tmp_path / world))
    return out


def assert_neighbours_indistinguishable(a, b):
    assert os.path.isfile(os.path.join(a, "summary.json")) and os.path.isfile(os.path.join(a, "progress.csv"))
    assert released_outputs_differ(a, b), "the replaced user never reached the release: the test shows nothing"
    assert differences(a, b) == []


GYM = ["algo=dp_pg", "rounds=2", "users_per_round=4", "group_size=4", "eval_episodes=1", "env.horizon=60", *QUIET]


def gym_world(world, run_dir):
    """Gym stream: in world b, user 1's episodes start from another state (its reset seed replaced)."""
    from dppo.data import streams

    original = streams.user_seeds

    def seeds(run_seed, users):
        s = original(run_seed, users)
        return [x + 7919 if world == "b" and int(u) == 1 else x for u, x in zip(users, s)]
    with mock.patch.object(streams, "user_seeds", seeds):
        _cli(GYM, run_dir)


def bandit_world(world, run_dir):
    """The bandit population: in world b, member 2's context replaced by another one."""
    import numpy as np

    from dppo.envs.bandit import ContextualBandit

    init = ContextualBandit.__init__

    def replaced(self, *args, **kw):
        init(self, *args, **kw)
        if world == "b":
            self.contexts[2] = self._draw(np.random.default_rng([99, 2]))
    with mock.patch.object(ContextualBandit, "__init__", replaced):
        _cli(["algo=dp_pg", "env=bandit", "policy=loglinear", "env.population=20", "group_size=2",
              "users_per_round=4", "rounds=2", "eval_episodes=2", *QUIET], run_dir)


def tabular_world(world, run_dir):
    """A tabular env (DP-UBEV on RiverSwim): in world b, episode 3's randomness (its whole trajectory) replaced."""
    from dppo.envs.tabular import TabularMDP

    uniforms = TabularMDP.uniforms

    def replaced(self, n, generator):
        u = uniforms(self, n, generator)
        if world == "b" and n > 3:
            u[3] = 1.0 - u[3]
        return u
    with mock.patch.object(TabularMDP, "uniforms", replaced):
        _cli(["algo=dp_ubev", "env=riverswim", "episodes=200", "algo.episodes_per_round=100", "eval_episodes=2",
              *QUIET], run_dir)


def gym_world_hash_ordered_hparams(world, run_dir):
    """``gym_world`` with the run's hyper-parameters recorded in hash order (a set of their names): a file that
    depends on the process's hash seed, for the test that the comparison catches one."""
    from dppo.build import run

    resolved = run.resolved_hparams

    def hash_ordered(*args, **kw):
        hp = resolved(*args, **kw)
        return {k: hp[k] for k in set(hp)}
    with mock.patch.object(run, "resolved_hparams", hash_ordered):
        gym_world(world, run_dir)


WORLDS = ("gym_world", "bandit_world", "tabular_world")


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory):
    """Every kind's two neighbours: world a's runs in one process (hash seed 1), world b's in another (2)."""
    base = tmp_path_factory.mktemp("neighbours")
    return neighbours_in_own_processes(base, *(f"{MODULE}:{w}" for w in (*WORLDS, "gym_world_hash_ordered_hparams")))


@pytest.mark.parametrize("world", WORLDS)
def test_neighbours_in_processes_of_their_own_write_the_same_shareable_files(neighbours, world):
    """Gym stream, bandit population, tabular env; each neighbour in its own process and hash seed."""
    assert_neighbours_indistinguishable(*neighbours[world])


def test_the_neighbour_test_catches_a_file_that_depends_on_the_hash_seed(neighbours):
    """The comparison is not blind to the process: the hyper-parameters recorded in the order of a set of their
    names (Python's hash order, which PYTHONHASHSEED sets) make the events files of the two neighbours differ."""
    assert [k for k in differences(*neighbours["gym_world_hash_ordered_hparams"]) if "tfevents" in k]
