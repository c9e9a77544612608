"""scripts/reproduce_suite.py: which runs it schedules (cached runs skipped, SB3's 1e6-step rows on fewer
seeds), and its report (final return mean/min, env steps to target, users' env steps) on synthetic run
directories (no training)."""
import csv
import importlib.util
import json
import os
import pathlib
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("reproduce_suite", ROOT / "scripts" / "reproduce_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _args(tmp_path, **kw):
    base = dict(envs=["cartpole"], seeds=[0, 1], rows=None, all_sb3_seeds=False, out=str(tmp_path / "suite"),
                md=str(tmp_path / "suite.md"), png=str(tmp_path / "suite.png"),
                curves_png=str(tmp_path / "curves.png"), jobs=1)
    return types.SimpleNamespace(**{**base, **kw})


def _fake_run(mod, args, env, name, seed, final, users, curve):
    path = mod.run_dir(args.out, env, name, seed)
    os.makedirs(path)
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"final_return": final, "env_steps": {"users": users, "public": 0}, "complete": True,
                   "wall_time_s": 1.0}, f)
    with open(os.path.join(path, "curve.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["env_steps", "eval_return"])
        w.writerows(curve)


def test_the_schedule_has_every_row_at_eps_5_and_1_and_sb3_1e6_rows_on_fewer_seeds(tmp_path):
    mod = _module()
    names = {(j[1], j[2]) for j in mod.jobs(_args(tmp_path, envs=list(mod.ENVS), seeds=list(range(10))))}
    for env in mod.ENVS:
        for row in ("PPO", "DP-PPO eps=5", "DP-PPO eps=1"):
            # an env whose optional package is missing (icu_sepsis without the [icu] extra) is skipped, not scheduled
            assert ((env, row) in names) == mod.available(env)
    jobs = mod.jobs(_args(tmp_path, envs=["acrobot"], seeds=list(range(10)), rows=["SB3-PPO"]))
    assert [j[3] for j in jobs] == list(range(mod.SB3_SEEDS[("acrobot", "PPO")]))
    cp = mod.jobs(_args(tmp_path, rows=["DP-PPO eps=5"]))
    assert [j[4][0] for j in cp] == ["+experiment=cartpole_dp_ppo"] * 2 and all("eps=5.0" in j[4] for j in cp)
    # a budget with its own file (cartpole_dp_ppo_eps1.yaml) runs that file; the others keep the env's file
    eps1 = {j[1]: j[4][0] for j in mod.jobs(_args(tmp_path, envs=["cartpole", "acrobot"], rows=["DP-PPO eps=1"]))}
    assert eps1 == {"cartpole": "+experiment=cartpole_dp_ppo_eps1", "acrobot": "+experiment=acrobot_dp_ppo"}


def test_the_report_gives_mean_and_min_final_return_and_the_first_curve_point_at_the_target(tmp_path):
    mod = _module()
    args = _args(tmp_path, rows=["PPO", "SB3-PPO"])
    _fake_run(mod, args, "cartpole", "PPO", 0, 500.0, 100_000, [(10_000, 100.0), (40_000, 480.0), (50_000, 470.0)])
    _fake_run(mod, args, "cartpole", "PPO", 1, 300.0, 200_000, [(10_000, 100.0), (60_000, 475.0)])
    _fake_run(mod, args, "cartpole", "SB3-PPO", 0, 500.0, 100_000, [(30_000, 490.0)])
    mod.report(args, None)
    text = (tmp_path / "suite.md").read_text()
    ppo = next(line for line in text.splitlines() if line.startswith("| PPO |"))
    cells = [c.strip() for c in ppo.strip("|").split("|")]
    assert cells[1:5] == ["2 (0, 1)", "150,000", "400.0", "300.0"]
    assert cells[5] == "50,000 (max 60,000; 2/2)"
    assert "| SB3-PPO | 1 (0) |" in text and (tmp_path / "suite.png").is_file()
    # cached runs are not scheduled again
    todo = [j for j in mod.jobs(args) if not mod.complete(mod.run_dir(args.out, j[1], j[2], j[3]))]
    assert {(j[2], j[3]) for j in todo} == {("SB3-PPO", 1)}


def test_the_report_shows_every_cached_run_whatever_rows_envs_and_seeds_the_invocation_ran(tmp_path):
    """--rows / --only / --seeds choose what runs; the table holds every complete run on disk, with its seeds."""
    mod = _module()
    args = _args(tmp_path, envs=["cartpole"], seeds=[0], rows=["PPO"])
    for s in (0, 1, 2):
        _fake_run(mod, args, "cartpole", "PPO", s, 500.0, 10_000, [(5_000, 480.0)])
    _fake_run(mod, args, "acrobot", "DP-PPO eps=5", 7, -80.0, 50_000, [(50_000, -80.0)])
    mod.report(args, None)
    text = (tmp_path / "suite.md").read_text()
    assert "| PPO | 3 (0-2) |" in text and "| DP-PPO eps=5 | 1 (7) |" in text
    assert "## Acrobot-v1" in text and "| NPG | 0 | (not run) |" in text


def test_records_keep_a_run_after_its_directory_is_gone_and_a_changed_config_drops_them(tmp_path):
    """Every run the report sees is kept in the records file; the next report takes the seed from there when
    the directory is gone, with the same numbers, unless the row's fingerprint changed (then it is set aside,
    kept in the file but unused, and the report names it)."""
    import shutil

    mod = _module()
    mod.fingerprint = lambda env, name: "fp-1"
    records = tmp_path / "records.json"
    args = _args(tmp_path, rows=["PPO"], records=str(records))
    _fake_run(mod, args, "cartpole", "PPO", 0, 500.0, 100_000, [(10_000, 100.0), (40_000, 480.0)])
    _fake_run(mod, args, "cartpole", "PPO", 1, 300.0, 200_000, [(60_000, 475.0)])
    mod.report(args, None)
    first = (tmp_path / "suite.md").read_text()
    saved = json.loads(records.read_text())
    assert set(saved) == {"cartpole|PPO|0", "cartpole|PPO|1"} and saved["cartpole|PPO|0"]["fingerprint"] == "fp-1"
    shutil.rmtree(mod.run_dir(args.out, "cartpole", "PPO", 1))
    mod.report(args, None)
    line = lambda text: next(x for x in text.splitlines() if x.startswith("| PPO |"))
    assert line((tmp_path / "suite.md").read_text()) == line(first)   # "2 (0, 1) | 150,000 | 400.0 | 300.0 | ..."
    mod.fingerprint = lambda env, name: "fp-2"   # the row's config changed: seed 1's record is stale
    mod.report(args, None)
    text = (tmp_path / "suite.md").read_text()
    assert "| PPO | 1 (0) |" in line(text) and "Left out: 1 runs" in text and "cartpole/PPO seeds 1 (1)" in text
    saved = json.loads(records.read_text())   # set aside, not lost: still stamped with the config it was made with
    assert set(saved) == {"cartpole|PPO|0", "cartpole|PPO|1"} and saved["cartpole|PPO|1"]["fingerprint"] == "fp-1"
    assert saved["cartpole|PPO|0"]["fingerprint"] == "fp-2"   # seed 0 is on disk: re-stamped from its run
    mod.fingerprint = lambda env, name: "fp-1"   # the config back as it was: the kept record counts again
    mod.report(args, None)
    assert "| PPO | 2 (0, 1) |" in line((tmp_path / "suite.md").read_text())


def test_a_row_with_no_run_keeps_its_previous_line_marked_and_fresh_drops_it(tmp_path):
    mod = _module()
    args = _args(tmp_path, rows=["PPO"])
    (tmp_path / "suite.md").write_text("## Acrobot-v1\n\n| learner | seeds |\n|---|---|\n"
                                       "| DP-PPO eps=5 | 10 (0-9) | 486,452 | -83.0 | -90.2 | - | 5 | 32 |\n")
    mod.report(args, None)
    text = (tmp_path / "suite.md").read_text()
    assert "| DP-PPO eps=5 †| 10 (0-9) | 486,452 | -83.0 | -90.2 | - | 5 | 32 |" in text
    assert "† 1 rows have no run" in text
    mod.report(args, None)   # carried again from the marked line, not marked twice
    assert (tmp_path / "suite.md").read_text().count("DP-PPO eps=5 †|") == 1
    args.fresh = True
    mod.report(args, None)
    text = (tmp_path / "suite.md").read_text()   # nothing measured on Acrobot then: its section is left out
    assert "DP-PPO eps=5 †" not in text and "## Acrobot-v1" not in text


def test_a_run_on_disk_made_with_another_config_is_left_out_and_named(tmp_path):
    """A run's saved config (its .hydra/config.yaml without the seed) must match the row's current config."""
    mod = _module()
    args = _args(tmp_path, rows=["PPO"])
    for s, lr in ((0, 0.1), (1, 0.2)):
        _fake_run(mod, args, "cartpole", "PPO", s, 500.0 - s, 10_000, [(5_000, 480.0)])
        os.makedirs(os.path.join(mod.run_dir(args.out, "cartpole", "PPO", s), ".hydra"))
        with open(os.path.join(mod.run_dir(args.out, "cartpole", "PPO", s), ".hydra", "config.yaml"), "w") as f:
            f.write(f"seed: {s}\nalgo:\n  lr: {lr}\n")
    mod.fingerprint = lambda env, name: mod._hash({"algo": {"lr": 0.1}})
    mod.report(args, None)
    text = (tmp_path / "suite.md").read_text()
    assert "| PPO | 1 (0) |" in text and "Left out: 1 runs" in text and "cartpole/PPO (on disk) seeds 1 (1)" in text
    fps = {}
    assert mod.up_to_date(args.out, "cartpole", "PPO", 0, fps) and not mod.up_to_date(args.out, "cartpole", "PPO", 1, fps)


def test_the_public_init_row_runs_only_where_its_file_exists_and_the_report_names_its_public_steps(tmp_path):
    mod = _module()
    rows = {(j[1], j[2]) for j in mod.jobs(_args(tmp_path, envs=list(mod.ENVS), seeds=[0]))}
    assert {e for e, r in rows if r.startswith("DP-PPO public-init")} == {"cartpole"}
    cp = mod.jobs(_args(tmp_path, rows=["DP-PPO public-init eps=5"], seeds=[0]))
    assert [j[4][0] for j in cp] == ["+experiment=cartpole_dp_ppo_public_init"]
    args = _args(tmp_path, envs=["cartpole", "acrobot"], rows=["DP-PPO public-init"])
    _fake_run(mod, args, "cartpole", "DP-PPO public-init eps=5", 0, 490.0, 300_000, [(300_000, 490.0)])
    mod.report(args, None)
    text = (tmp_path / "suite.md").read_text()
    with open(ROOT / "assets" / "pretrained" / "cartpole_long_pole" / "summary.json") as f:
        public = json.load(f)["env_steps"]["users"]
    assert "| DP-PPO public-init eps=5 | 1 (0) | 300,000 |" in text
    assert f"{public:,} public env steps" in text and text.count("DP-PPO public-init eps=1") == 1  # cartpole only


def test_an_env_with_nothing_measured_gets_no_section_of_empty_rows(tmp_path):
    """A report made where an env was never run (no run, record or earlier line) leaves that env out, rather
    than a section whose every row is '(not run)'; an env with one run keeps its section."""
    mod = _module()
    args = _args(tmp_path, rows=["PPO"])
    _fake_run(mod, args, "cartpole", "PPO", 0, 500.0, 100_000, [(10_000, 480.0)])
    mod.report(args, None)
    text = (tmp_path / "suite.md").read_text()
    assert "## CartPole-v1" in text and "## Acrobot-v1" not in text and "(not run)" in text   # CartPole's other rows
