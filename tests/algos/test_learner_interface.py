"""The learner interface says what a learner needs (``dppo.algos.base.Learner``): every learner of ``conf/algo``
declares what the builder passes it (``needs``, checked against its constructor both ways), how long its run is
(``run_length`` / ``planned_length``), the users a whole run draws (``planned_users``, checked against the users a
finished run drew) and its step axis (``horizon``); and the trainer and builder read these declarations instead of
guessing from attribute names or signatures (a static check of their source)."""
import ast
import glob
import inspect
import os

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from dppo.algos.base import Learner
from dppo.api import make_config
from dppo.build import build
from dppo.build.extension import extension_rules
from dppo.build.run import learner_class
from dppo.config import INJECTABLE
from dppo.errors import ConfigError
from dppo.training.steps import StepCounter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALGOS = sorted(os.path.basename(f)[:-5] for f in glob.glob(os.path.join(ROOT, "conf", "algo", "*.yaml")))
CLASSES = sorted({get_class(make_config([f"algo={a}"]).algo._target_) for a in ALGOS}, key=lambda c: c.__name__)


def test_every_registered_learner_is_found():
    names = {c.__name__ for c in CLASSES}
    assert {"PolicyGradient", "PPO", "NaturalPolicyGradient", "REBEL", "UBEV", "PUCB", "DPUBEV", "GFALearner",
            "GFAOutcomeLearner"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_learner_declares_exactly_what_its_constructor_takes_from_the_builder(cls):
    """``needs`` names every injectable keyword of ``__init__`` and nothing it does not take; every other keyword
    is a hyper-parameter with a default (so ``Learner.defaults`` lists the ``algo.*`` keys it accepts)."""
    assert issubclass(cls, Learner)
    params = {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n != "self"}
    assert not any(p.kind == p.VAR_KEYWORD for p in params.values())
    assert len(set(cls.needs)) == len(cls.needs) and set(cls.needs) <= set(INJECTABLE)
    assert set(cls.needs) == {n for n in params if n in INJECTABLE}
    assert all(n in cls.defaults() for n in params if n not in cls.needs)
    assert cls.run_length in ("rounds", "episodes")
    assert (cls.run_length == "rounds") == ("rounds" in cls.needs)
    assert cls.run_length == "rounds" or "episodes" in cls.needs


RUNS = {
    "dp_pg": ["algo=dp_pg", "privacy.secure_rng=false", "rounds=3", "users_per_round=3", "eval_episodes=1",
              "progress=false", "env.horizon=30"],
    "ppo": ["algo=ppo", "rounds=2", "users_per_round=4", "eval_episodes=1", "progress=false", "env.horizon=30"],
    "dp_npg": ["algo=dp_npg", "privacy.secure_rng=false", "rounds=2", "users_per_round=3", "eval_episodes=1",
               "progress=false", "env.horizon=30"],
    "pucb": ["algo=pucb", "env=riverswim", "eps=1", "episodes=50", "algo.episodes_per_round=20", "eval_episodes=1",
             "progress=false", "privacy.secure_rng=false"],
    "dp_ubev": ["algo=dp_ubev", "env=riverswim", "eps=1", "episodes=50", "algo.episodes_per_round=20",
                "eval_episodes=1", "progress=false", "privacy.secure_rng=false"],
    "gfa": ["algo=gfa", "env=riverswim", "eps=5", "episodes=30", "batch_size=10", "algo.grid_points=4",
            "eval_episodes=1", "progress=false", "privacy.secure_rng=false"],
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_planned_users_and_length_are_what_a_finished_run_drew(name):
    """A complete run draws ``planned_users`` users (the sampler's count, independent of the declaration) over
    ``planned_length`` rounds or episodes, as the config set them."""
    trainer = build(make_config(RUNS[name]))      # no run directory: nothing written
    learner, sampler = trainer.learner, trainer.sampler
    planned = learner.planned_users(sampler.users_per_round)
    summary = trainer.fit()
    assert summary["complete"] and summary["users_seen"] == len(sampler.used) == planned
    args = dict(a.split("=", 1) for a in RUNS[name])
    assert learner.planned_length == int(args[learner.run_length])
    rules = trainer.extend_refusal
    assert set(rules) == {"rounds", learner.run_length}


def test_the_step_axis_counts_the_declared_horizon_where_a_round_reports_no_env_steps():
    class Fixed(Learner):
        horizon = 7

    counter = StepCounter()
    counter.update({"rollout/users": 3.0}, Fixed())           # 3 episodes of the declared 7 steps
    counter.update({"rollout/episodes": 2.0, "diag/env_steps": 5.0}, Fixed())   # reported: taken as is
    counter.update({"rollout/users": 4.0}, Learner())          # no horizon declared: one step per episode
    assert (counter.env_steps, counter.episodes) == (3 * 7 + 5 + 4, 3 + 2 + 4)


class _Privacy:
    private, multi_pass = False, False


@pytest.mark.parametrize("run_length,refusal,expected", [
    ("rounds", None, {"rounds": None}),
    ("rounds", "no more", {"rounds": "no more"}),
    ("episodes", None, {"rounds": "algo=x runs for a number of episodes, not rounds", "episodes": None}),
    ("episodes", "no more", {"rounds": "algo=x runs for a number of episodes, not rounds", "episodes": "no more"}),
])
def test_the_extension_rules_follow_the_learners_declarations(run_length, refusal, expected):
    """A non-private run: only the learner's own declarations decide what a resume may raise."""
    declared = type("Declared", (Learner,), {"run_length": run_length, "names": ("x", "x"),
                                             "extension_refusal": classmethod(lambda cls, algo: refusal)})
    cfg = OmegaConf.create({"eps": None, "algo": {"_target_": "tests.Declared"}})
    assert extension_rules(cfg, declared, _Privacy()) == expected


def test_an_algo_target_that_is_no_learner_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="is not a dppo.algos.base.Learner") as err:
        learner_class(OmegaConf.create({"algo": {"_target_": "collections.OrderedDict"}}))
    assert "\n" not in str(err.value)


# the modules that used to guess what a learner needs from its attribute names or its constructor's signature
ASKING = ["dppo/training/trainer.py", "dppo/training/steps.py", "dppo/build/learner.py", "dppo/build/extension.py",
          "dppo/build/run.py"]
LEARNER_NAMES = {"learner", "cls"}


def _guesses(path: str, source: str | None = None) -> list[str]:
    """Calls that read a learner by guessing: getattr / hasattr on the learner (``learner``, ``self.learner``,
    ``cls``) and ``inspect.signature``."""
    if source is None:
        with open(os.path.join(ROOT, path)) as f:
            source = f.read()
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "signature" and getattr(f.value, "id", None) == "inspect":
            found.append(f"{path}:{node.lineno} inspect.signature")
        if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr") and node.args:
            target = node.args[0]
            name = target.id if isinstance(target, ast.Name) else (
                target.attr if isinstance(target, ast.Attribute) else None)
            if name in LEARNER_NAMES:
                found.append(f"{path}:{node.lineno} {f.id}({ast.unparse(target)}, ...)")
    return found


def test_the_trainer_and_builder_ask_the_learner_instead_of_guessing():
    assert [g for path in ASKING for g in _guesses(path)] == []


def test_the_static_check_finds_a_guess():
    """The check above is not vacuous: it reports each kind of guess it looks for."""
    src = ("import inspect\nx = getattr(self.learner, 'T', None)\ny = hasattr(cls, 'B')\n"
           "z = inspect.signature(cls.__init__)\nw = getattr(sampler, 'used', ())\n")
    assert [g.split(" ", 1)[1] for g in _guesses("probe", src)] == [
        "getattr(self.learner, ...)", "hasattr(cls, ...)", "inspect.signature"]
