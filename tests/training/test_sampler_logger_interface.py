"""The user sampler and the logger declare what the trainer, the builder and the learners read
(``dppo.data.UserSampler``, ``dppo.training.logger.Logger``): both built-in samplers implement the base, a
user's sampler that implements only its draws runs with the base's declarations, and the builder refuses, in one
line and before any user is drawn, a sampler or a logger that is not one (the static check that nothing reads them
by guessing is ``tests/algos/test_learner_interface.py``)."""
import pytest

from dppo.api import make_config
from dppo.build import build
from dppo.data import OnePassUserSampler, PoissonUserSampler, UserSampler
from dppo.errors import ConfigError
from dppo.training.logger import Logger

RUN = ["algo=dp_pg", "privacy.secure_rng=false", "rounds=2", "users_per_round=3", "eval_episodes=1",
       "progress=false", "env.horizon=20"]


def test_both_samplers_implement_the_declared_base():
    one, poisson = OnePassUserSampler(2, population_size=10), PoissonUserSampler(2, 10)
    assert isinstance(one, UserSampler) and isinstance(poisson, UserSampler)
    assert (one.multi_pass, poisson.multi_pass) == (False, True)
    assert (one.sample_rate, poisson.sample_rate) == (None, 0.2)
    assert (one.population_size, poisson.population_size) == (10, 10)
    for s in (one, poisson):
        assert s.users_per_round == 2 and s.used == set() and s.burned == set() and s.journal is None
        s.next_round()
        assert set(s.state_dict()["used"]) == s.used
    with pytest.raises(ConfigError, match="users_per_round must be >= 1"):
        PoissonUserSampler(0, 10)


class Sequential(UserSampler):
    """A user's sampler that implements only its draws: users 0, 1, 2, ... a round at a time."""

    def next_round(self):
        start = len(self.used)
        ids = list(range(start, start + self.users_per_round))
        if self.journal is not None:
            self.journal.take(ids)
        self.used.update(ids)
        return ids

    def burn(self, ids):
        self.used.update(ids)
        self.burned.update(ids)

    def state_dict(self):
        return {"used": sorted(self.used), "burned": sorted(self.burned)}

    def load_state_dict(self, state):
        self.used, self.burned = set(state["used"]), set(state["burned"])


def test_a_users_sampler_that_implements_only_its_draws_runs_with_the_bases_declarations():
    """One-pass (``multi_pass`` False), no capacity check (``check_need`` of the base checks nothing), nobody
    burned: the summary counts the users it drew."""
    sampler = Sequential(3)
    summary = build(make_config(RUN), sampler=sampler).fit()
    assert summary["complete"] and sampler.used == set(range(6))
    assert (summary["users_seen"], summary["users_burned"]) == (6, 0)


@pytest.mark.parametrize("key,says", [("sampler", "sampler= takes a dppo.data.UserSampler"),
                                      ("logger", "logger= takes a dppo.training.logger.Logger")])
def test_the_builder_refuses_a_sampler_or_a_logger_of_no_declared_interface_in_one_line(key, says):
    class Undeclared:
        used: set = set()

    with pytest.raises(ConfigError, match=says) as err:
        build(make_config(RUN), **{key: Undeclared()})
    assert "\n" not in str(err.value) and "Undeclared" in str(err.value)


def test_a_logger_passed_in_is_used_as_it_is():
    logger = Logger(diagnostics=False)
    trainer = build(make_config(RUN), logger=logger)
    assert trainer.logger is logger
    summary = trainer.fit()
    assert summary["complete"] and "diag" not in summary and "users" not in summary["env_steps"]
