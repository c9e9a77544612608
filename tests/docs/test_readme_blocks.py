"""The README's Python blocks run exactly as printed.

In a fresh working directory, the run directory a block loads is made first (a short run of the algorithm its
name says) and ``shared/policy.pt`` is that run's policy.pt copied alone; then the block's text is executed
unchanged. The "Use a trained policy" block is a fast test (``dppo.load`` on a lone policy.pt must give
``run.summary["epsilon_spent"]``); every Python block of the README, with the objects it names but does not
define (``my_policy``, ``MyCallback``, ``my_reward``, ``my_dataset``), is a slow one.
"""
from __future__ import annotations

import os
import re
import shutil

import pytest
import torch

from tests.docs.test_readme import README, code_blocks

LOADED_RUN = re.compile(r'dppo\.load\("(runs/[^"]+)"\)')
SHARED = re.compile(r'dppo\.load\("([^"]+/policy\.pt)"\)')
SHORT = ["rounds=2", "users_per_round=3", "group_size=2", "eval_episodes=2", "progress=false",
         "logger.tensorboard=false"]


def python_blocks() -> list[str]:
    return [body for info, body in code_blocks(README.read_text()) if info == "python"]


def _prepare(block: str, cwd) -> None:
    """The run directories and the lone policy.pt the block loads, under ``cwd``."""
    import dppo

    for run_dir in LOADED_RUN.findall(block):
        algo = re.search(r"_([a-z_]+)_s\d+$", run_dir)
        if not os.path.isdir(cwd / run_dir):
            dppo.train([f"algo={algo.group(1) if algo else 'dp_pg'}", *SHORT], run_dir=str(cwd / run_dir))
    for policy_file in SHARED.findall(block):
        source = next((r for r in LOADED_RUN.findall(block)), None)
        assert source, "a block that loads a shared policy.pt also names the run it comes from"
        os.makedirs(cwd / os.path.dirname(policy_file), exist_ok=True)
        shutil.copy(cwd / source / "policy.pt", cwd / policy_file)     # the policy.pt alone, nothing beside it


def test_the_use_a_trained_policy_block_runs_as_printed_on_a_lone_policy_pt(tmp_path, monkeypatch, capsys):
    block = next(b for b in python_blocks() if "dppo.load(" in b and "policy.pt" in b)
    monkeypatch.chdir(tmp_path)
    _prepare(block, tmp_path)
    assert sorted(os.listdir(tmp_path / "shared")) == ["policy.pt"]
    capsys.readouterr()
    names = {"__name__": "__readme__"}
    exec(compile(block, "README.md", "exec"), names)
    printed = capsys.readouterr().out     # print(run): a few lines, the eps spent among them
    assert printed.startswith("SavedRun(dp_npg on CartPole-v1") and len(printed.splitlines()) <= 8
    assert "eps spent 5 of 5" in printed and names["run"].summary["epsilon_spent"] == pytest.approx(5.0)
    assert names["mean"] > 0 and names["std"] >= 0      # evaluate(return_std=True): SB3's (mean, std)


def _placeholders(cwd) -> dict:
    """The objects the README's blocks name as the user's own (a user's rows: prompts and answers, no split
    column), and the repository's shipped assets reachable from ``cwd`` as from the repository root."""
    import gymnasium as gym

    from dppo.envs.tasks.addition import digit_reward, write_prompts
    from dppo.policies.mlp import MLPPolicy
    from dppo.training.callbacks import Callback
    from tests.lm.conftest import read_jsonl

    (cwd / "assets").symlink_to(README.parent / "assets")
    write_prompts(str(cwd / "rows.jsonl"), public=0, private=1200, seed=3)
    rows = [{"prompt": r["prompt"], "answer": r["answer"]} for r in read_jsonl(str(cwd / "rows.jsonl"))]

    class MyCallback(Callback):
        pass

    env = gym.make("CartPole-v1")
    model = torch.nn.Linear(4, 2)   # your own loop's module, optimizer and per-user loss (the make_private block)

    def per_user_loss(module, users):
        x = torch.stack([torch.full((4,), float(u % 7)) for u in users])
        return module(x).square().sum(1)

    return {"my_policy": MLPPolicy(env.observation_space, env.action_space), "MyCallback": MyCallback,
            "my_reward": digit_reward, "my_dataset": rows, "model": model,
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "per_user_loss": per_user_loss,
            "__name__": "__readme__"}


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_every_python_block_of_the_readme_runs_as_printed(index, tmp_path, monkeypatch):
    block = python_blocks()[index]
    monkeypatch.chdir(tmp_path)
    _prepare(block, tmp_path)
    exec(compile(block, "README.md", "exec"), _placeholders(tmp_path))


def test_the_readmes_extend_example_extends_the_default_run():
    """The quick start's "extend a finished run" line raises the rounds of the run ``python train.py`` makes
    (the extension itself: tests/training/test_shareable_and_extend.py)."""
    from dppo import make_config

    line = next(ln for ln in README.read_text().splitlines() if "extend a finished run" in ln)
    rounds = int(re.search(r"\brounds=(\d+)", line).group(1))
    assert re.search(r"\bresume=runs/\S+", line) and rounds > make_config([]).rounds


@pytest.mark.slow
def test_the_quick_starts_commands_run_as_printed(tmp_path):
    """The quick start's "Then:" block, command by command, in a fresh working directory holding the repository's
    train.py and conf/: the run its resume / evaluate lines name is made first by ``python train.py`` itself
    (``hydra.run.dir`` set to that name); `tensorboard` (a server) is not started. Every command exits 0; the
    resume of the finished run says there is nothing to do and the extend line extends it."""
    import json
    import subprocess
    import sys

    from tests.docs.test_readme import shell_commands

    root = README.parent
    for name in ("train.py", "conf"):
        (tmp_path / name).symlink_to(root / name)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    block = [body for info, body in code_blocks(README.read_text()) if info == "bash"][1]
    commands = [c for c in shell_commands(block) if c[0] != "tensorboard"]
    named = sorted({a.split("=", 1)[1] for c in commands for a in c if a.startswith("resume=")})
    assert len(named) == 1
    made = subprocess.run([sys.executable, "train.py", "progress=false", f"hydra.run.dir={named[0]}"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    for cmd in commands:
        if cmd[:2] == ["python", "-m"] and cmd[2] == "dppo.plot":
            cmd = [*cmd[:3], *(a if not a.startswith("runs/multirun") else "runs/multirun" for a in cmd[3:])]
        args = [sys.executable, *cmd[1:]] if cmd[0] == "python" else cmd
        res = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert res.returncode == 0, f"{' '.join(cmd)}: {res.stderr[-2000:]}"
        if "resume=" in " ".join(cmd) and "rounds=" not in " ".join(cmd):
            assert "nothing to do" in res.stderr
    summary = json.loads((tmp_path / named[0] / "summary.json").read_text())
    extend = next(c for c in commands if "resume=" in " ".join(c) and any(a.startswith("rounds=") for a in c))
    assert summary["rounds_done"] == int(next(a for a in extend if a.startswith("rounds=")).split("=")[1])
