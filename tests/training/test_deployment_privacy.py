"""Privacy that holds in deployment: unpredictable noise by default, labelled seeded noise, crash-safe user
accounting (journal, burned users, charged lost releases), per-key resume refusal, released-only callbacks,
switchable diagnostics, and shareable vs secret run files."""
import csv
import json
import os

import pytest
import torch

import dppo
from dppo.build import build
from dppo.errors import ConfigError, PrivacyError
from dppo.training.callbacks import Callback, StopAtReturn
from dppo.training.journal import JOURNAL_NAME, UserJournal

SECURE = ["privacy.secure_rng=true", "rounds=3", "users_per_round=3", "eval_episodes=2", "progress=false",
          "env.horizon=40"]


class StopAfter(Callback):
    def __init__(self, last_round):
        self.last_round = last_round

    def on_round_end(self, trainer, round_idx, metrics):
        return round_idx < self.last_round


def _policy_weights(run_dir):
    return torch.load(os.path.join(run_dir, "policy.pt"), weights_only=True)["policy"]


def test_default_config_draws_noise_from_the_os_csprng():
    cfg = dppo.make_config([])
    assert cfg.privacy.secure_rng is True
    trainer = build(dppo.make_config(["algo=dp_pg", "progress=false"]))
    assert trainer.privacy.noise.secure and trainer.privacy.noise.generator is None


def test_secure_runs_with_the_same_seed_release_different_policies_seeded_ones_identical(tmp_path):
    runs = {}
    for name, mode in [("s1", "true"), ("s2", "true"), ("p1", "false"), ("p2", "false")]:
        # algo.shrink=false: the James-Stein step (on by default) zeroes a round's step whose released mean is
        # mostly noise (|g|^2 < d s^2); in these 3-user rounds both secure runs could keep their initial policy
        dppo.train(["algo=dp_pg", *SECURE, f"privacy.secure_rng={mode}", "algo.shrink=false"],
                   run_dir=str(tmp_path / name))
        runs[name] = _policy_weights(tmp_path / name)
    # the seed does not determine the noise (DP-PG's default update moves the head subspace only)
    assert any(not torch.equal(runs["s1"][k], runs["s2"][k]) for k in runs["s1"])
    assert all(torch.equal(runs["p1"][k], runs["p2"][k]) for k in runs["p1"])   # seeded: reproducible


def test_summary_names_the_noise_source_and_seeded_mode_warns_once(tmp_path, capsys):
    secure = dppo.train(["algo=dp_pg", *SECURE], run_dir=str(tmp_path / "secure"))
    assert secure["noise_source"] == "os_csprng" and "noise_note" not in secure
    assert "warning" not in capsys.readouterr().err
    seeded = dppo.train(["algo=dp_pg", *SECURE, "privacy.secure_rng=false"], run_dir=str(tmp_path / "seeded"))
    assert seeded["noise_source"] == "seeded" and "knows the seed" in seeded["noise_note"]
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "secure_rng=false" in warnings[0]
    assert json.load(open(tmp_path / "seeded" / "summary.json"))["noise_source"] == "seeded"


def test_shared_files_hold_no_noise_state_and_secure_checkpoints_hold_no_generator(tmp_path):
    dppo.train(["algo=dp_pg", *SECURE], run_dir=str(tmp_path))
    shared = torch.load(os.path.join(tmp_path, "policy.pt"), weights_only=True)
    # the weights, the public config that rebuilds them, their provenance and summary.json's public part: no
    # optimizer, RNG, noise or journal
    assert set(shared) == {"format", "policy", "config", "provenance", "rounds_done", "algo", "env_id", "summary"}
    summary = json.load(open(tmp_path / "summary.json"))
    assert shared["summary"] == {k: summary[k] for k in shared["summary"]} and "ledger" not in shared["summary"]
    fresh = build(dppo.make_config(["algo=dp_pg", *SECURE])).learner.policy
    assert set(shared["policy"]) == set(fresh.state_dict())   # the policy's parameters, nothing else
    assert shared["config"]["privacy"]["secure_rng"] is True and "hydra" not in shared["config"]
    assert shared["provenance"]["consumed"][0]["users"] == [[0, 9]]   # 3 rounds x 3 users, ids only
    from omegaconf import OmegaConf

    public = OmegaConf.to_container(OmegaConf.load(tmp_path / ".hydra" / "config.yaml"), resolve=True)
    public.pop("resume")
    assert shared["config"] == public                           # the same public config as .hydra/config.yaml
    text = open(tmp_path / "summary.json").read()
    assert "generator" not in text and "rng_state" not in text and "\"noise\":" not in text
    from dppo.training.checkpoint import load_latest_checkpoint

    state, _ = load_latest_checkpoint(str(tmp_path / "checkpoints"))
    assert state["privacy"]["noise"] == {"secure": True}


def test_every_take_is_journalled_before_the_round_and_every_release_after_it(tmp_path):
    dppo.train(["algo=dp_pg", *SECURE], run_dir=str(tmp_path))
    events = UserJournal.read(str(tmp_path / JOURNAL_NAME))
    kinds = [e["event"] for e in events]
    assert kinds == ["start"] + ["take", "release"] * 3
    takes = [e["users"] for e in events if e["event"] == "take"]
    assert takes == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    summary = json.load(open(tmp_path / "summary.json"))
    assert [e["entry"] for e in events if e["event"] == "release"] == summary["ledger"]


def _crashed_attempt(run_dir, round_idx, users, entry, incarnation=1):
    """Append what a crashed attempt of ``round_idx`` would have journalled (take + release)."""
    with open(os.path.join(run_dir, JOURNAL_NAME), "a") as f:
        f.write(json.dumps({"event": "start", "incarnation": incarnation, "round": round_idx}) + "\n")
        f.write(json.dumps({"event": "take", "round": round_idx, "incarnation": incarnation, "users": users}) + "\n")
        if entry is not None:
            f.write(json.dumps({"event": "release", "round": round_idx, "incarnation": incarnation,
                                "entry": entry}) + "\n")
        f.write('{"event": "take", "round": 9, "us')      # a torn line: its write never returned


def test_secure_resume_burns_the_crashed_attempts_users_and_charges_its_release(tmp_path):
    args = ["algo=dp_pg", *SECURE, "rounds=4", "checkpoint_every=1"]
    part = dppo.train(args, run_dir=str(tmp_path), callbacks=[StopAfter(1)])
    entry = dict(part["ledger"][-1], round=2)
    _crashed_attempt(str(tmp_path), 2, [6, 7, 8], entry)
    done = dppo.train(args, run_dir=str(tmp_path), resume=True)
    takes = [e["users"] for e in UserJournal.read(str(tmp_path / JOURNAL_NAME)) if e["event"] == "take"]
    flat = [u for t in takes for u in t]
    assert len(flat) == len(set(flat)) == 15                    # no user in two takes, burned ones included
    assert done["users_burned"] == 3 and done["users_seen"] == 15 and done["releases_lost"] == 1
    live = [e["round"] for e in done["ledger"] if not e.get("lost")]
    assert live == [0, 1, 2, 3]
    assert done["epsilon_spent"] == pytest.approx(5.0)        # burned users are disjoint: parallel composition


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_secure_multi_pass_resume_charges_the_lost_release_only_with_consent(tmp_path):
    """A lost multi-pass release composes with the rest: the finished run would exceed its target eps, so the
    resume is refused naming the amount, unless privacy.allow_over_target=true."""
    args = ["algo=dp_pg", *SECURE, "rounds=4", "checkpoint_every=1", "privacy.multi_pass=true",
            "privacy.population_size=30"]
    part = dppo.train(args, run_dir=str(tmp_path), callbacks=[StopAfter(1)])
    entry = dict(part["ledger"][-1], round=2)
    _crashed_attempt(str(tmp_path), 2, [1, 5], entry)
    with pytest.raises(PrivacyError, match=r"resume refused: .* up to [0-9.]+ more than its target eps=5"):
        dppo.train(args, run_dir=str(tmp_path), resume=True)
    done = dppo.train([*args, "privacy.allow_over_target=true"], run_dir=str(tmp_path), resume=True)
    full = dppo.train(args, run_dir=str(tmp_path / "full"))
    assert done["releases_lost"] == 1 and len(done["ledger"]) == 5
    assert done["epsilon_spent"] > full["epsilon_spent"]          # five Poisson releases composed, not four
    assert done["adjacency"] == "add_remove"


def test_seeded_resume_replays_the_same_users_and_refuses_a_diverging_replay(tmp_path):
    args = ["algo=dp_pg", *SECURE, "privacy.secure_rng=false", "rounds=4", "checkpoint_every=1"]
    part = dppo.train(args, run_dir=str(tmp_path / "a"), callbacks=[StopAfter(1)])
    _crashed_attempt(str(tmp_path / "a"), 2, [6, 7, 8], dict(part["ledger"][-1], round=2))
    done = dppo.train(args, run_dir=str(tmp_path / "a"), resume=True)
    assert done["users_burned"] == 0 and done["users_seen"] == 12 and done["releases_lost"] == 0
    dppo.train(args, run_dir=str(tmp_path / "b"), callbacks=[StopAfter(1)])
    _crashed_attempt(str(tmp_path / "b"), 2, [100, 101, 102], None)
    with pytest.raises(PrivacyError, match="seeded replay of round 2"):
        dppo.train(args, run_dir=str(tmp_path / "b"), resume=True)


def test_a_fresh_start_in_a_crashed_directory_burns_what_the_crash_journalled(tmp_path):
    """A crash before the first checkpoint cannot be resumed; starting again in the same directory must
    still not hand the crashed attempt's users to a second release."""
    os.makedirs(tmp_path, exist_ok=True)
    _crashed_attempt(str(tmp_path), 0, [0, 1, 2], None, incarnation=0)
    s = dppo.train(["algo=dp_pg", *SECURE], run_dir=str(tmp_path))
    takes = [e["users"] for e in UserJournal.read(str(tmp_path / JOURNAL_NAME)) if e["event"] == "take"]
    assert takes[0] == [0, 1, 2] and all(not set(t) & {0, 1, 2} for t in takes[1:])
    assert s["users_burned"] == 3 and s["users_seen"] == 12


@pytest.mark.parametrize("change", ["rounds=3", "eps=3", "users_per_round=4", "max_grad_norm=0.5",
                                    "privacy.secure_rng=false", "privacy.max_epsilon=9", "algo.lr=0.5",
                                    "reward_bound=2", "seed=3"])
def test_resume_refuses_a_privacy_relevant_change_naming_the_key(tmp_path, change):
    args = ["algo=dp_pg", *SECURE, "rounds=4", "checkpoint_every=1"]
    dppo.train(args, run_dir=str(tmp_path), callbacks=[StopAfter(0)])
    trainer = build(dppo.make_config([*args, change]), str(tmp_path))
    key = change.split("=")[0]
    with pytest.raises(ConfigError, match=f"'{key}' was"):
        trainer.try_resume()


def test_resume_accepts_logging_and_checkpoint_changes(tmp_path):
    args = ["algo=dp_pg", *SECURE, "rounds=4", "checkpoint_every=1"]
    dppo.train(args, run_dir=str(tmp_path), callbacks=[StopAfter(0)])
    trainer = build(dppo.make_config([*args, "checkpoint_every=3", "logger.csv=false", "eval_episodes=1"]),
                    str(tmp_path))
    assert trainer.try_resume() and trainer.fit()["rounds_done"] == 4


def test_oracle_clip_change_is_refused_on_resume(tmp_path):
    args = ["algo=dp_npg", "oracle=ssp", *SECURE, "rounds=3", "checkpoint_every=1"]
    dppo.train(args, run_dir=str(tmp_path), callbacks=[StopAfter(0)])
    trainer = build(dppo.make_config([*args, "oracle.y_bound=7"]), str(tmp_path))
    with pytest.raises(ConfigError, match="'oracle.y_bound' was"):
        trainer.try_resume()


def test_user_callbacks_of_a_private_run_see_no_raw_statistics(tmp_path):
    seen = []

    class Spy(Callback):
        def on_round_end(self, trainer, round_idx, metrics):
            seen.append(set(metrics))

    dppo.train(["algo=dp_pg", *SECURE], run_dir=str(tmp_path / "private"), callbacks=[Spy()])
    assert seen and all(not any(k.startswith(("diag/", "perf/")) for k in keys) for keys in seen)
    assert all({"privacy/epsilon", "rollout/users", "rollout/round"} <= keys for keys in seen)
    seen.clear()
    dppo.train(["algo=pg", *SECURE], run_dir=str(tmp_path / "public"), callbacks=[Spy()])
    assert all("diag/return" in keys for keys in seen)         # non-private: nothing to protect


def test_stop_at_return_decides_on_a_public_evaluation_not_on_this_rounds_users(tmp_path):
    calls = []

    class Watch(StopAtReturn):
        def on_round_end(self, trainer, round_idx, metrics):
            assert "diag/return" not in metrics
            out = super().on_round_end(trainer, round_idx, metrics)
            calls.append(self.last_eval)
            return out

    s = dppo.train(["algo=dp_pg", *SECURE, "rounds=5"], run_dir=str(tmp_path),
                   callbacks=[Watch(threshold=0.0, episodes=2)])
    assert s["rounds_done"] == 1 and "stopped by a callback" in s["stop_reason"] and calls[0] > 0


def test_diagnostics_off_drops_every_diag_key_from_every_output(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    s = dppo.train(["algo=dp_pg", *SECURE, "logger.diagnostics=false", "logger.console=true"],
                   run_dir=str(tmp_path))
    assert "diag" not in s and "diag" not in json.load(open(tmp_path / "summary.json"))
    header = next(csv.reader(open(tmp_path / "progress.csv")))
    assert header and not [k for k in header if k.startswith("diag/")]
    tags = EventAccumulator(str(tmp_path)).Reload().Tags()["scalars"]
    assert "privacy/epsilon" in tags and not [k for k in tags if k.startswith("diag/")]


@pytest.mark.parametrize("overrides", [
    ["algo=dp_pg", "rounds=2"],
    ["algo=dp_pg", "rounds=2", "privacy.multi_pass=true", "privacy.population_size=30"],
    ["algo=dp_npg", "rounds=2", "oracle=ssp"], ["algo=dp_npg", "rounds=2", "oracle=dp_gd"],
    ["algo=dp_npg", "rounds=2", "oracle=exp_mech"], ["algo=dp_rebel", "rounds=2"],
    ["algo=pucb", "env=riverswim", "episodes=40", "algo.episodes_per_round=20"],
    ["algo=gfa", "env=riverswim", "episodes=40", "batch_size=10", "algo.grid_points=4"],
])
def test_every_release_speaks_the_one_ledger_vocabulary(tmp_path, overrides):
    tabular = "env=riverswim" in overrides  # episodes, not rounds of users: rounds/users_per_round do not apply
    base = [a for a in SECURE if not (tabular and a.startswith(("rounds=", "users_per_round=")))]
    s = dppo.train([*base, *overrides], run_dir=str(tmp_path))
    assert s["ledger"] and s["adjacency"] in ("replace_one", "add_remove")
    for e in s["ledger"]:
        assert {"mechanism", "round", "users", "eps", "delta", "adjacency", "sensitivity"} <= set(e), e
        assert e["adjacency"] == s["adjacency"]
        if "sigma" in e:
            assert e["noise_multiplier"] == pytest.approx(e["sigma"] / e["sensitivity"], rel=1e-12)
        else:
            assert "beta" in e or "scale" in e, e          # pure DP: its scale / inverse temperature


def test_progress_bar_shows_a_raw_return_only_with_diagnostics_and_prefers_the_public_one():
    from types import SimpleNamespace

    from dppo.training.callbacks import ProgressBarCallback
    from dppo.training.logger import Logger

    class Bar:
        def set_postfix(self, post, refresh=False):
            self.post = dict(post)

        def update(self, n):
            pass

    def shown(diagnostics, metrics):
        cb = ProgressBarCallback(True)
        cb.bar = Bar()
        trainer = SimpleNamespace(logger=Logger(diagnostics=diagnostics), privacy=SimpleNamespace(private=True))
        cb.on_round_end(trainer, 0, metrics)
        return cb.bar.post

    raw = {"diag/return": 17.25, "privacy/epsilon": 5.0}
    assert shown(True, raw) == {"eps": "5"}    # a raw (clipped) return of the users is never shown as the return
    assert shown(False, raw) == {"eps": "5"}
    assert shown(False, {**raw, "eval/return": 0.72354}) == {"eval_return": "0.7235", "eps": "5"}


def test_secure_resume_charges_learners_whose_releases_span_rounds(tmp_path):
    """PUCB's tree counters and GFA's releases read earlier rounds' users, whom a redo cannot replace:
    a crashed attempt's extra releases on them are charged (PUCB: a second copy of its counters)."""
    pucb = ["algo=pucb", "env=riverswim", "eps=2", "episodes=60", "algo.episodes_per_round=20",
            "privacy.secure_rng=true", "progress=false", "eval_episodes=1", "checkpoint_every=1"]
    part = dppo.train(pucb, run_dir=str(tmp_path / "pucb"), callbacks=[StopAfter(0)])
    assert part["epsilon_spent"] == pytest.approx(2.0)
    _crashed_attempt(str(tmp_path / "pucb"), 1, list(range(20, 40)), None)
    with pytest.raises(PrivacyError, match="put eps spent at 4, above the target eps=2"):  # never without consent
        dppo.train(pucb, run_dir=str(tmp_path / "pucb"), resume=True)
    done = dppo.train([*pucb, "privacy.allow_over_target=true"], run_dir=str(tmp_path / "pucb"), resume=True)
    replays = [e for e in done["ledger"] if e.get("replay")]
    assert len(replays) == 3 and done["epsilon_spent"] == pytest.approx(4.0) and done["users_burned"] == 20

    gfa = ["algo=gfa", "env=riverswim", "eps=5", "episodes=40", "batch_size=10", "algo.grid_points=4",
           "privacy.secure_rng=true", "progress=false", "eval_episodes=1", "checkpoint_every=1"]
    full = dppo.train(gfa, run_dir=str(tmp_path / "gfa_full"))
    part = dppo.train(gfa, run_dir=str(tmp_path / "gfa"), callbacks=[StopAfter(1)])
    _crashed_attempt(str(tmp_path / "gfa"), 2, list(range(20, 30)), dict(part["ledger"][-1], round=2))
    with pytest.raises(PrivacyError, match="compose with the run's other releases"):
        dppo.train(gfa, run_dir=str(tmp_path / "gfa"), resume=True)
    done = dppo.train([*gfa, "privacy.allow_over_target=true"], run_dir=str(tmp_path / "gfa"), resume=True)
    assert done["releases_lost"] == 1 and done["epsilon_spent"] > full["epsilon_spent"] + 1e-9


def test_timings_are_dropped_with_the_diagnostics():
    """perf/* rates depend on this round's episode lengths: logger.diagnostics=false drops them too."""
    from dppo.training.logger import Logger, Output

    class Sink(Output):
        def __init__(self):
            self.seen = {}

        def write(self, metrics, step):
            self.seen.update(metrics)

    sink = Sink()
    log = Logger([sink], diagnostics=False)
    log.record_many({"perf/tokens_per_s": 10.0, "perf/users_per_s": 3.0, "diag/return": 1.0, "privacy/epsilon": 5.0})
    log.dump(0)
    assert sink.seen == {"privacy/epsilon": 5.0}
