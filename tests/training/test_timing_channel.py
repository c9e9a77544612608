"""No timing side channel with ``logger.diagnostics=false``: no wall-clock figure in summary.json, TensorBoard
events stamped with the round index, no timing in the progress bar; callbacks of a private run see only
allow-listed released / public keys."""
import glob
import json
import re

import dppo
from dppo.training.callbacks import Callback, released_only

RUN = ["algo=dp_pg", "rounds=3", "users_per_round=2", "group_size=2", "eval_episodes=2", "env.horizon=30",
       "logger.diagnostics=false", "privacy.secure_rng=false"]


def _events(run_dir):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return [e for f in sorted(glob.glob(f"{run_dir}/events.out.tfevents.*")) for e in EventFileLoader(f).Load()]


def test_without_diagnostics_no_output_carries_a_clock(tmp_path, capsys):
    s = dppo.train([*RUN, "progress=true"], run_dir=str(tmp_path))
    assert "wall_time_s" not in s and "wall_time_s" not in json.load(open(tmp_path / "summary.json"))
    events = [e for e in _events(tmp_path) if e.HasField("summary")]
    scalars = {(v.tag, e.step): e.wall_time for e in events for v in e.summary.value}
    rounds = {step: wall for (tag, step), wall in scalars.items() if tag == "rollout/round"}
    assert sorted(rounds.values()) == [0.0, 1.0, 2.0]                    # the public clock: the round index
    assert all(wall in (0.0, 1.0, 2.0) for wall in scalars.values())
    assert all(e.wall_time <= 2.0 for e in events)                       # text / hparams too
    bar = capsys.readouterr().err
    assert "3/3" in bar and not re.search(r"\d+(\.\d+)?(s/round|round/s)|\[\d\d:\d\d", bar)


def test_with_diagnostics_timing_is_a_labelled_diagnostic(tmp_path, capsys):
    s = dppo.train([*RUN, "logger.diagnostics=true", "progress=true"], run_dir=str(tmp_path))
    assert s["wall_time_s"] > 0 and "diag" in s
    assert re.search(r"s/round|round/s", capsys.readouterr().err)


def test_private_callbacks_get_an_allow_list_not_a_deny_list(tmp_path):
    seen = []

    class Spy(Callback):
        def on_round_end(self, trainer, round_idx, metrics):
            seen.append(dict(metrics))

    dppo.train([*RUN, "logger.diagnostics=true", "progress=false"], run_dir=str(tmp_path), callbacks=[Spy()])
    allowed = ("privacy/", "eval/", "losses/", "regret/", "counters/", "gfa/")
    assert seen and all(k.startswith(allowed) or k in ("rollout/users", "rollout/episodes", "rollout/round")
                        for m in seen for k in m)
    metrics = {"perf/users_per_s": 3.0, "perf/tokens_per_s": 9.0, "diag/return": 1.0, "new/raw_stat": 2.0,
               "privacy/epsilon": 5.0, "rollout/users": 2, "rollout/episode_length": 7.0, "losses/grad_norm": 0.1}
    assert released_only(metrics) == {"privacy/epsilon": 5.0, "rollout/users": 2, "losses/grad_norm": 0.1}
