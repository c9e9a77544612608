"""``eval_every``: on by default (``auto``: about 10 evaluations per run), ``null`` at the end only; every
evaluation runs public held-out episodes that nothing else draws from, so a run trains the very same policy
(same users, same releases, same summary) with or without its intermediate evaluations."""
from __future__ import annotations

import csv

import gymnasium as gym
import pytest
import torch

import dppo
from dppo.config import validate
from dppo.data.streams import PUBLIC_SEED_BASE
from dppo.errors import ConfigError
from dppo.training.callbacks import eval_interval
from dppo.training.checkpoint import check_fingerprint

QUIET = ["progress=false", "privacy.secure_rng=false", "logger.tensorboard=false"]
# (overrides, rounds): small runs of a policy learner on each kind of env and of the tabular / GFA learners
RUNS = {
    "dp_npg": (["algo=dp_npg", "rounds=20", "users_per_round=2", "group_size=2", "env.horizon=30",
                "eval_episodes=2"], 20),
    "dp_ppo": (["algo=dp_ppo", "rounds=4", "users_per_round=4", "env.horizon=30", "eval_episodes=2"], 4),
    "dp_ubev": (["algo=dp_ubev", "env=riverswim", "episodes=300", "algo.episodes_per_round=30",
                 "eval_episodes=5"], 10),
    "gfa": (["algo=gfa", "env=riverswim", "episodes=40", "batch_size=10", "algo.grid_points=4",
             "eval_episodes=5"], 4),
}


def test_the_default_is_auto_about_ten_evaluations_per_run():
    assert dppo.make_config([]).eval_every == "auto"
    assert [eval_interval("auto", r) for r in (1, 9, 10, 25, 200, 10_000)] == [1, 1, 1, 2, 20, 1000]
    for rounds in (10, 19, 25, 200, 999):   # evaluations of a run (the final one included): 10 to 19
        every = eval_interval("auto", rounds)
        assert 10 <= rounds // every + (rounds % every != 0) <= 19
    assert eval_interval(None, 200) is None and eval_interval(7, 200) == 7
    for bad in ("often", 0):
        with pytest.raises(ConfigError, match="eval_every must be an int >= 1, auto"):
            validate(dppo.make_config([f"eval_every={bad}"]))


def _rows(run_dir):
    with open(run_dir / "progress.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", list(RUNS))
def test_intermediate_evaluations_leave_the_trained_policy_and_the_summary_unchanged(name, tmp_path):
    args, rounds = RUNS[name]
    end = dppo.train([*args, *QUIET, "eval_every=null"], run_dir=str(tmp_path / "end"))
    auto = dppo.train([*args, *QUIET], run_dir=str(tmp_path / "auto"))
    # the same policy, releases and summary; only the public rollouts' env steps and the timing differ
    assert auto["policy_sha256"] == end["policy_sha256"] and auto["ledger"] == end["ledger"]
    differ = sorted(k for k in set(end) | set(auto) if end.get(k) != auto.get(k))
    assert set(differ) <= {"env_steps", "wall_time_s"}, differ
    assert auto["env_steps"]["users"] == end["env_steps"]["users"]
    if end["env_steps"]["public"] is not None:
        assert auto["env_steps"]["public"] > end["env_steps"]["public"]
    # progress.csv: the same rows; eval/return at the end only vs. every max(1, R // 10) rounds and at the end
    a, e = _rows(tmp_path / "auto"), _rows(tmp_path / "end")
    assert len(a) == len(e) == rounds
    for ra, re in zip(a, e):
        assert {k: v for k, v in ra.items() if not k.startswith(("eval/", "perf/"))} == \
               {k: v for k, v in re.items() if not k.startswith(("eval/", "perf/"))}
    every = eval_interval("auto", rounds)
    assert [i for i, r in enumerate(e) if r["eval/return"]] == [rounds - 1]
    assert [i for i, r in enumerate(a) if r["eval/return"]] == \
           [i for i in range(rounds) if (i + 1) % every == 0 or i == rounds - 1]
    assert float(a[-1]["eval/return"]) == float(e[-1]["eval/return"]) == pytest.approx(end["final_return"])


@pytest.mark.parametrize("args", [["algo=dp_ubev", "env=random_mdp", "episodes=60", "algo.episodes_per_round=30"],
                                  ["algo=gfa", "env=random_mdp", "episodes=40", "batch_size=10", "algo.grid_points=4"],
                                  ["algo=gfa_outcome", "env=context_bits", "episodes=40", "batch_size=10"]])
def test_every_evaluation_of_a_tabular_or_gfa_learner_runs_the_same_held_out_episodes(args):
    from dppo.build import build

    trainer = build(dppo.make_config([*args, *QUIET]), None)
    trainer.learner.train_round(0)
    returns = [trainer.learner.evaluate(13) for _ in range(4)]
    assert len(set(returns)) == 1, returns


class _NoisyWalk(gym.Env):
    """A Discrete env without a model (the learners' model-free adapter): moves succeed at random, from the
    env's own seeded generator, so an episode depends on its reset seed."""

    observation_space = gym.spaces.Discrete(4)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.s = 0
        return 0, {}

    def step(self, a):
        if self.np_random.random() < 0.7:
            self.s = min(self.s + 1, 3) if a == 1 else max(self.s - 1, 0)
        return self.s, float(self.s == 3), False, False, {}


def test_model_free_tabular_evaluation_uses_public_seeds_and_moves_no_user():
    from dppo.algos.ucb import UBEV
    from dppo.envs.tabular import GymTabularEnv
    from dppo.privacy import NoiseSource, PrivacyContext
    from dppo.privacy.accountants import make_accountant

    def learner():
        env = _NoisyWalk()
        env.spec = None
        return UBEV(GymTabularEnv(env, horizon=5), privacy=PrivacyContext(None, accountant=make_accountant("basic"),
                                                                          noise=NoiseSource(0)),
                    seed=3, episodes=60, episodes_per_round=20)

    plain, evaluated = learner(), learner()
    for r in range(3):
        plain.train_round(r)
        evaluated.train_round(r)
        first, again = evaluated.evaluate(10), evaluated.evaluate(10)
        assert first == again                     # the same held-out episodes at every evaluation
    assert torch.equal(plain.episode_return, evaluated.episode_return)    # the users' episodes are unchanged
    assert plain.evaluate(10) == evaluated.evaluate(10)
    seeds = evaluated.mdp.eval_seeds(10)
    assert min(seeds) >= PUBLIC_SEED_BASE and max(seeds) < 2 * PUBLIC_SEED_BASE   # public, never a user's
    assert evaluated.mdp._episodes == 60          # evaluation took no user's episode index


def test_a_resume_may_change_eval_every_even_against_an_older_checkpoint():
    """``eval_every`` is no longer in the fingerprint (how often a run evaluates changes no release); an
    older checkpoint that fingerprinted it is resumed whatever its value was."""
    cfg = dppo.make_config(["eval_every=3"])
    from dppo.build import fingerprint

    now = fingerprint(cfg)
    assert "eval_every" not in now
    check_fingerprint({**now, "eval_every": 20}, now)
    check_fingerprint({**now, "eval_every": None}, fingerprint(dppo.make_config(["eval_every=null"])))
    with pytest.raises(ConfigError, match="'rounds'"):
        check_fingerprint({**now, "eval_every": 20}, {**now, "rounds": 7})
