"""The learner interface says what a learner needs (``dppo.algos.base.Learner``): every learner of ``conf/algo``
declares what the builder passes it (``needs``, checked against its constructor both ways), how long its run is
(``run_length`` / ``planned_length``), the users a whole run draws (``planned_users``, checked against the users a
finished run drew), its step axis (``horizon``), its ``algo.*`` keys and their types (``hyperparameters``) and what
the builder resolved for it (``resolved_hparams``); a learner that declares nothing gets the base's defaults; an
oracle declares what a learner asks of it (``LeastSquaresOracle``); the user sampler (``dppo.data.UserSampler``) and
the logger (``Logger``) declare what the trainer, the builder and the learners read, and the trainer initialises its
own state; and no module of dppo reads any of these by guessing from attribute names or signatures, besides the few
kept ones, each with its reason (a static check of the source)."""
import ast
import glob
import inspect
import math
import os
import sys
import types

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf, open_dict

from dppo.algos.base import Learner
from dppo.api import make_config
from dppo.build import build
from dppo.build.checks import algo_name, check_config_values, key_kind
from dppo.build.extension import extension_rules
from dppo.build.privacy import check_accountant
from dppo.build.run import learner_class
from dppo.config import INJECTABLE, group_keys, run_shape_defaults
from dppo.errors import ConfigError
from dppo.oracles.base import LeastSquaresOracle
from dppo.oracles.ssp import SSPOracle
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
    if learner.run_length == "episodes":   # one user per episode, each of the declared horizon's H steps
        H = trainer.population.env.H        # the env the run was built with
        assert learner.horizon == H and trainer.steps.env_steps == planned * H
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


@pytest.mark.parametrize("algo", ALGOS)
def test_every_registered_learner_declares_its_algo_keys_and_the_config_checks_read_them(algo):
    """``hyperparameters`` names the constructor's keywords the builder does not inject (recomputed here from the
    signature), each with a default; the config's algo keys are those (``group_keys``), its group file sets only
    declared keys, and a key whose default is an int or a float is checked as one."""
    cfg = make_config([f"algo={algo}"])
    cls = learner_class(cfg)
    declared = cls.hyperparameters()
    params = inspect.signature(cls.__init__).parameters
    assert set(declared) == {n for n in params if n != "self" and n not in INJECTABLE}
    assert group_keys(cfg, "algo") == set(declared)
    assert all(default is not inspect.Parameter.empty for _, default in declared.values())
    assert set(cfg.algo) - {"_target_", "name"} <= set(declared)
    for key, (_, default) in declared.items():
        if isinstance(default, float) or (isinstance(default, int) and not isinstance(default, bool)):
            assert key_kind(cls, key)[0] == type(default).__name__, key


class Declared(Learner):
    """A learner taking its keys through ``**kwargs``: what it declares is what the config checks read."""

    needs = ("seed",)
    names = ("declared", "dp_declared")
    default_run_shape = {"rounds": 3, "users_per_round": 2, "group_size": 5}

    def __init__(self, *, seed: int, **keys):
        self.keys = keys

    @classmethod
    def hyperparameters(cls) -> dict:
        return {"alpha": (float, 0.1), "steps": (int, 3)}


class Bare(Learner):
    """Declares nothing: the base's defaults."""


@pytest.fixture
def importable(monkeypatch):
    module = types.ModuleType("declared_learners")
    module.Declared, module.Bare = Declared, Bare
    monkeypatch.setitem(sys.modules, "declared_learners", module)


def _algo_cfg(target: str, **algo):
    return OmegaConf.create({"device": "cpu", "eps": None, "algo": {"_target_": target, **algo}})


def test_the_config_checks_read_what_a_learner_declares(importable):
    cfg = _algo_cfg("declared_learners.Declared")
    assert group_keys(cfg, "algo") == {"alpha", "steps"}
    assert run_shape_defaults(cfg) == Declared.default_run_shape
    assert algo_name(cfg, Declared, private=True) == "dp_declared" and algo_name(cfg, Declared, private=False) == "declared"
    check_config_values(_algo_cfg("declared_learners.Declared", alpha=0.5, steps=4))
    for key, bad, says in [("steps", 2.5, "algo.steps must be an integer"),
                           ("alpha", math.nan, "algo.alpha must be a finite number")]:
        with pytest.raises(ConfigError, match=says):
            check_config_values(_algo_cfg("declared_learners.Declared", **{key: bad}))


def test_a_learner_that_declares_nothing_gets_the_bases_defaults(importable):
    cfg = _algo_cfg("declared_learners.Bare")
    assert run_shape_defaults(cfg) == Learner.default_run_shape == {"rounds": 100, "users_per_round": 10, "group_size": 8}
    assert Bare.hyperparameters() == {} and group_keys(cfg, "algo") == set()
    assert algo_name(cfg, Bare, private=True) == "Bare"       # no names, no algo.name: the target's own name
    assert algo_name(_algo_cfg("declared_learners.Bare", name="mine"), Bare, private=True) == "mine"
    assert (Bare.needs, Bare.reads, Bare.APPLIES, Bare.run_length, Bare.space_defaults, Bare.uses_composition) == \
        ((), (), {}, "rounds", None, False)
    bare = Bare()
    assert bare.horizon is None and bare.public_env_steps is None
    assert bare.resolved_hparams() == {} and bare.released_modules() == {} and bare.lost_attempt_charges([0]) == []
    assert Bare.extension_refusal("x") is None and not Bare.releases_pure_dp(cfg)


@pytest.mark.parametrize("target", ["collections.OrderedDict", "no_such_module.Learner"])
def test_an_algo_target_that_is_no_learner_gets_the_bases_run_shape_and_declares_no_keys(target):
    """Before the build refuses it (one line, ``learner_class``), a composed config with such a target still resolves
    its run shape (the base's) and names it (algo.name, else its last part)."""
    cfg = _algo_cfg(target)
    assert run_shape_defaults(cfg) == Learner.default_run_shape and group_keys(cfg, "algo") == set()
    assert algo_name(cfg, None, private=True) == target.rsplit(".", 1)[-1]


ORACLES = sorted(os.path.basename(f)[:-5] for f in glob.glob(os.path.join(ROOT, "conf", "oracle", "*.yaml")))


def test_every_registered_oracle_declares_what_a_learner_asks_of_it():
    """Each oracle of ``conf/oracle`` is a ``LeastSquaresOracle``; pure eps-DP releases are exp_mech's alone (an
    exponential-mechanism draw; ssp and dp_gd add Gaussian noise, exact releases nothing private)."""
    classes = {name: get_class(make_config(["algo=dp_npg", f"oracle={name}"]).oracle._target_) for name in ORACLES}
    assert set(classes) == {"dp_gd", "exact", "exp_mech", "ssp"}
    assert all(issubclass(c, LeastSquaresOracle) for c in classes.values())
    assert {name for name, c in classes.items() if c.pure_dp} == {"exp_mech"}
    assert {name for name, c in classes.items() if c.uses_public_gram} == {"ssp"}


class PureSSP(SSPOracle):
    pure_dp = True     # a (made-up) oracle declaring pure releases: the accountant rules follow the declaration


def test_the_accountant_rules_follow_the_oracles_declaration_not_its_name(monkeypatch):
    module = types.ModuleType("declared_oracles")
    module.PureSSP = PureSSP
    monkeypatch.setitem(sys.modules, "declared_oracles", module)
    cls = get_class("dppo.algos.npg.NaturalPolicyGradient")
    check_accountant(make_config(["algo=dp_npg", "oracle=exp_mech"]), cls, "advanced")    # pure: composes
    cfg = make_config(["algo=dp_npg", "oracle=ssp"])
    with pytest.raises(ConfigError, match="composes pure-DP"):
        check_accountant(cfg, cls, "advanced")
    with open_dict(cfg):
        cfg.oracle._target_ = "declared_oracles.PureSSP"
    check_accountant(cfg, cls, "advanced")


def test_an_oracle_target_that_is_no_oracle_is_refused_in_one_line():
    cfg = make_config(["algo=dp_npg", "oracle=exact", "eps=null", "rounds=1", "users_per_round=2", "progress=false"])
    with open_dict(cfg):
        cfg.oracle = {"_target_": "collections.OrderedDict"}
    with pytest.raises(ConfigError, match="is not a dppo.oracles.base.LeastSquaresOracle") as err:
        build(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("overrides,oracle", [(["algo=dp_npg"], "ssp"), (["algo=dp_npg", "oracle=exp_mech"], "exp_mech"),
                                              (["algo=npg"], "exact"), (["algo=dp_pg"], None)])
def test_the_recorded_hyper_parameters_name_the_oracle_the_learner_was_built_with(overrides, oracle):
    """``oracle`` null becomes the family's default; the learner says which (``resolved_hparams``); a learner
    without an oracle records the config's null."""
    trainer = build(make_config([*overrides, "rounds=1", "users_per_round=2", "progress=false", "eval_episodes=1"]))
    assert trainer.hparams["oracle"] == oracle
    assert trainer.learner.resolved_hparams() == ({} if oracle is None else {"oracle": oracle})


# Where dppo still reads an object's signature or attributes by name, and why: none of these is a declaration of a
# learner, an oracle, a sampler, a logger or the trainer read around its interface. Every other module asks them.
KEPT = {
    # the declarations' one home: a learner's keyword arguments are its hyper-parameters (Learner.defaults /
    # hyperparameters read the signature once, for every learner)
    "dppo/algos/base.py:defaults inspect.signature",
    "dppo/algos/base.py:hyperparameters inspect.signature",
    # env, policy and oracle targets share no base class to declare keys on (classes, factory functions such as
    # riverswim or auto_policy, a user's callable): their signature is their declaration
    "dppo/config.py:accepted_keys inspect.signature",
    "dppo/config.py:group_keys inspect.signature",
    "dppo/build/checks.py:parameter_kind inspect.signature",
    # dppo.train's own keywords, for its did-you-mean line
    "dppo/api.py:check_train_keywords inspect.signature",
    # a Hugging Face model's forward (third-party): which cache keyword it takes
    "dppo/policies/lm.py:__init__ inspect.signature",
    # the audit's error line names the settings of whichever oracle the config has (ssp has no steps / radius)
    "dppo/audit/oracle_rounds.py:audit_oracle_round getattr(oracle, ...)",
}
LEARNER_NAMES = {"learner", "cls", "oracle"}
# the run's other objects with a declared interface: the user sampler (dppo.data.UserSampler), the logger
# (dppo.training.logger.Logger) and the trainer, whose callbacks read the state its __init__ sets; the multi-process
# wrappers' delegation (ShardedSampler.__getattr__: getattr(self.inner, name)) reads by a variable, no guess
DECLARED_NAMES = {"sampler", "logger", "trainer"}


def _guesses(path: str, source: str | None = None) -> list[str]:
    """Calls that read a declaration by guessing: getattr / hasattr on the learner (``learner``,
    ``self.learner``, ``trainer.learner``, ``cls``), an oracle (``oracle``, ``self.oracle``), the sampler
    (``sampler``, ``self.sampler``, ``trainer.sampler``), the logger (``logger``, ``self.logger``,
    ``trainer.logger``) or the trainer, on ``self`` by a literal name in ``dppo/training/`` (the trainer and its
    callbacks: their own state, which their ``__init__`` sets), and ``inspect.signature``; each as
    ``path:function call``."""
    if source is None:
        with open(os.path.join(ROOT, path)) as f:
            source = f.read()
    tree = ast.parse(source)
    where = {}
    for fn in ast.walk(tree):     # breadth first: an inner function is met after its outer one and wins
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                where[id(node)] = fn.name
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f, at = node.func, f"{path}:{where.get(id(node), '<module>')}"
        if isinstance(f, ast.Attribute) and f.attr == "signature" and getattr(f.value, "id", None) == "inspect":
            found.append(f"{at} inspect.signature")
        if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr") and node.args:
            target = node.args[0]
            name = target.id if isinstance(target, ast.Name) else (
                target.attr if isinstance(target, ast.Attribute) else None)
            own = (name == "self" and path.startswith("dppo/training/") and len(node.args) > 1
                   and isinstance(node.args[1], ast.Constant))
            if name in LEARNER_NAMES | DECLARED_NAMES or own:
                found.append(f"{at} {f.id}({ast.unparse(target)}, ...)")
    return found


def test_no_module_guesses_what_a_learner_an_oracle_a_sampler_or_a_logger_declares():
    """Every module of dppo (the trainer and its callbacks, the builder, the config checks, dppo.load, the learners
    themselves) asks the declarations of the learner, the oracle, the sampler, the logger and the trainer; what
    reads a signature or an attribute by name is only ``KEPT``."""
    paths = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "dppo", "**", "*.py"), recursive=True))
    found = {g for path in paths for g in _guesses(path)}
    assert found == KEPT


def test_the_static_check_finds_a_guess():
    """The check above is not vacuous: it reports each kind of guess it looks for, with the function it is in."""
    src = ("import inspect\nx = getattr(self.learner, 'T', None)\ndef f():\n    y = hasattr(cls, 'B')\n"
           "    z = inspect.signature(cls.__init__)\n    o = getattr(self.oracle, 'sharded', False)\n"
           "w = getattr(sampler, 'used', ())\nv = getattr(env, 'population', None)\n")
    assert sorted(_guesses("probe", src)) == ["probe:<module> getattr(sampler, ...)",
                                              "probe:<module> getattr(self.learner, ...)", "probe:f getattr(self.oracle, ...)",
                                              "probe:f hasattr(cls, ...)", "probe:f inspect.signature"]


def test_the_static_check_finds_a_guess_on_the_sampler_the_logger_and_the_trainer():
    """The same for the sampler, the logger and the trainer (and, in dppo/training/, the trainer's or a callback's
    own state read by a literal name); an env, a name read by a variable and ``self`` elsewhere are not reported."""
    src = ("class C:\n    def f(self, trainer, name):\n"
           "        a = getattr(self.sampler, 'multi_pass', False)\n        b = callable(getattr(s.sampler, 'check_need', None))\n"
           "        c = getattr(trainer.logger, 'diagnostics', True)\n        d = hasattr(logger, 'open')\n"
           "        e = getattr(trainer, 'summary', None)\n        g = getattr(self, '_resumed', False)\n"
           "        h = getattr(self, name)\n        i = getattr(self.env, 'population', 0)\n")
    declared = ["getattr(self.sampler, ...)", "getattr(s.sampler, ...)", "getattr(trainer.logger, ...)",
                "hasattr(logger, ...)", "getattr(trainer, ...)"]
    assert sorted(_guesses("dppo/training/probe.py", src)) == sorted(
        f"dppo/training/probe.py:f {call}" for call in declared + ["getattr(self, ...)"])
    assert sorted(_guesses("dppo/policies/probe.py", src)) == sorted(f"dppo/policies/probe.py:f {call}" for call in declared)
