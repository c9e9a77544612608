"""``python -m dppo.plot``: learning curves from the public columns of runs' progress.csv, runs of one config
over seeds averaged with a min-max band; checked on tiny real runs laid out as a multirun sweep."""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dppo
from dppo.plot import READ_COLUMNS, default_out, main, prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["algo=dp_pg", "rounds=5", "users_per_round=2", "group_size=2", "eval_episodes=2", "env.horizon=30",
        "progress=false", "privacy.secure_rng=false", "logger.tensorboard=false", "checkpoint_every=100"]
# a multirun sweep's layout (conf/config.yaml: hydra.sweep.subdir): <job number>_<algo>_<eps tag>_s<seed>
JOBS = {"0_dp_pg_eps5.0_s0": ["seed=0"], "1_dp_pg_eps5.0_s1": ["seed=1"], "2_dp_pg_eps1.0_s0": ["seed=0", "eps=1"],
        "3_pg_nonprivate_s0": ["seed=0", "eps=null"]}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirun") / "2024-01-01" / "12-00-00"
    for name, extra in JOBS.items():
        dppo.train([*TINY, *extra], run_dir=str(root / name))
    return root


def _png(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG and head[12:16] == b"IHDR"
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert width > 100 and height > 100
    import matplotlib.image

    assert matplotlib.image.imread(path).shape[:2] == (height, width)


def _independent(run_dirs):
    """Per run: {round: (global_step, eps spent, eval/return, users' episodes so far)} of its rows with an
    eval/return, read with csv.DictReader."""
    out = {}
    for d in run_dirs:
        with open(os.path.join(d, "progress.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        out[d] = {int(float(r["rollout/round"])): (float(r["global_step"]), float(r["privacy/epsilon"]),
                                                   float(r["eval/return"]),
                                                   sum(float(q["rollout/episodes"]) for q in rows[:i + 1]))
                  for i, r in enumerate(rows) if r["eval/return"] != ""}
    return out


def test_runs_of_one_config_are_averaged_over_seeds(sweep):
    groups = prepare([str(sweep)])
    assert [g.label for g in groups] == ["dp_pg eps=5 (2 seeds)", "dp_pg eps=1 (1 seed)", "pg non-private (1 seed)"]
    seeds = [str(sweep / "0_dp_pg_eps5.0_s0"), str(sweep / "1_dp_pg_eps5.0_s1")]
    assert [r.path for r in groups[0].runs] == seeds
    ref = _independent(seeds)
    rounds = sorted(set(ref[seeds[0]]) & set(ref[seeds[1]]))
    assert groups[0].rounds == rounds == [0, 1, 2, 3, 4]     # eval_every=auto: every round of a 5-round run
    table = np.array([[ref[d][r] for r in rounds] for d in seeds])    # [seed, round, (step, eps, return)]
    np.testing.assert_allclose(groups[0].steps, table[:, :, 0].mean(0))
    np.testing.assert_allclose(groups[0].eps, table[:, :, 1].mean(0))
    np.testing.assert_allclose(groups[0].mean, table[:, :, 2].mean(0))
    np.testing.assert_allclose(groups[0].low, table[:, :, 2].min(0))
    np.testing.assert_allclose(groups[0].high, table[:, :, 2].max(0))
    np.testing.assert_allclose(groups[0].episodes, table[:, :, 3].mean(0))
    assert groups[0].episodes.tolist() == [4.0, 8.0, 12.0, 16.0, 20.0]    # 2 users x G = 2 a round
    assert not np.array_equal(table[0, :, 0], table[1, :, 0])    # the seeds' env steps differ: really averaged
    one = _independent([str(sweep / "2_dp_pg_eps1.0_s0")])[str(sweep / "2_dp_pg_eps1.0_s0")]
    np.testing.assert_allclose(groups[1].mean, [one[r][2] for r in sorted(one)])
    assert groups[1].low.tolist() == groups[1].mean.tolist() == groups[1].high.tolist()
    assert groups[0].private and not groups[2].private


def test_only_public_columns_are_read(sweep, tmp_path):
    """Every other column (diag/*, perf/*, the released losses) overwritten with junk: the same curves."""
    assert not [c for c in READ_COLUMNS if c.startswith(("diag/", "perf/"))]
    copy = tmp_path / "run"
    shutil.copytree(sweep / "0_dp_pg_eps5.0_s0", copy)
    with open(copy / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert any(k.startswith("diag/") for k in rows[0])
    with open(copy / "progress.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({k: (v if k in READ_COLUMNS else "junk") for k, v in r.items()} for r in rows)
    (g,) = prepare([str(copy)])
    (ref,) = prepare([str(sweep / "0_dp_pg_eps5.0_s0")])
    assert g.rounds == ref.rounds and g.mean.tolist() == ref.mean.tolist() and g.steps.tolist() == ref.steps.tolist()
    assert g.episodes.tolist() == ref.episodes.tolist() and g.eps.tolist() == ref.eps.tolist()


def test_the_cli_writes_a_png_and_prints_its_path(sweep, tmp_path, capsys):
    run = str(sweep / "0_dp_pg_eps5.0_s0")
    assert main([str(sweep)]) == 0                                  # a multirun folder: plot.png in it
    assert capsys.readouterr().out.strip() == str(sweep / "plot.png")
    _png(sweep / "plot.png")
    assert main([run]) == 0                                         # one run: eval.png in it
    assert capsys.readouterr().out.strip() == os.path.join(run, "eval.png")
    _png(os.path.join(run, "eval.png"))
    two = [run, str(sweep / "1_dp_pg_eps5.0_s1")]
    assert default_out(two, 2) == str(sweep / "plot.png")           # several runs: their common parent
    out = tmp_path / "figs" / "curves.png"
    assert main([*two, "--out", str(out), "--x", "episodes"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    _png(out)


def test_errors_are_one_line_and_exit_2(sweep, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    no_eval = tmp_path / "no_eval"
    no_eval.mkdir()
    (no_eval / "progress.csv").write_text("global_step,privacy/epsilon,eval/return,rollout/round\n10,5.0,,0\n")
    public = tmp_path / "public"     # a run without diagnostics: its global_step counts episodes, not steps
    shutil.copytree(sweep / "1_dp_pg_eps5.0_s1", public)
    cfg = (public / ".hydra" / "config.yaml").read_text()
    assert "diagnostics: true" in cfg
    (public / ".hydra" / "config.yaml").write_text(cfg.replace("diagnostics: true", "diagnostics: false"))
    mixed = [str(sweep / "0_dp_pg_eps5.0_s0"), str(public)]
    for args, says in (([str(empty)], "no progress.csv"), ([str(no_eval)], "no eval/return rows"),
                       ([str(tmp_path / "missing")], "no such directory"),
                       ([str(sweep), "--out", str(tmp_path / "x.pdf")], "--out must name a .png"),
                       (mixed, "logger.diagnostics=false")):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and says in err, err
    assert main([*mixed, "--x", "episodes", "--out", str(tmp_path / "mixed.png")]) == 0   # a public axis for both
    r = subprocess.run([sys.executable, "-m", "dppo.plot", str(empty)], cwd=ROOT, capture_output=True, text=True,
                       check=False)
    line = f"dppo: error: {empty}: no progress.csv (neither a run directory nor a folder of runs)"
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [line]
