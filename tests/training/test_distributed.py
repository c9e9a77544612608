"""Multi-process training (torchrun, 2 CPU processes on gloo) against the single-process run."""
import json
import os
import socket
import subprocess
import sys

import pytest

from dppo.errors import ConfigError
from dppo.training.distributed import pick_backend, shard_bounds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = os.path.join(ROOT, "tests", "training", "dist_checks.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, n=2, env=None, timeout=240):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={free_port()}",
           *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def test_shards_are_contiguous_balanced_and_cover_every_user_once():
    for n in range(0, 23):
        for world in (1, 2, 3, 5):
            bounds = [shard_bounds(n, world, r) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            sizes = [hi - lo for lo, hi in bounds]
            assert max(sizes) - min(sizes) <= 1


def test_two_processes_gather_in_user_order_and_release_the_single_process_vector_of_their_sums(tmp_path):
    """Each rank clips and sums its users (rows, or a clipped sum formed elsewhere), rank 0 adds the sums in rank
    order and draws the noise once: bit for bit the single process's release of those sums, on both ranks, and
    its sum of every row to float64 rounding; the rounds are recorded once, on rank 0, when they open."""
    r = torchrun([CHECKS, "collectives", str(tmp_path)])
    assert r.returncode == 0, r.stderr[-2000:]
    ranks = [json.load(open(tmp_path / f"rank{i}.json")) for i in range(2)]
    assert [x["shard"] for x in ranks] == [[0, 4], [4, 7]]
    assert ranks[0]["gather_in_order"] is True and ranks[1]["gather_in_order"] is None
    assert all(x["broadcast"] == {"r": 0} for x in ranks)
    assert all(x["error_raised"] == "spent" for x in ranks)  # rank 0's refusal reaches every rank
    assert all(x["release_equal"] and x["sum_close"] for x in ranks)
    assert ranks[0]["ledger"] == ranks[0]["ref_ledger"] and len(ranks[0]["ledger"]) == 2
    assert ranks[0]["ledger"][0]["mechanism"] == "gaussian_sum" and ranks[0]["ledger"][0]["users"] == 7
    assert ranks[1]["ledger"] == []  # only rank 0 records


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the thread names from /proc")
def test_shutdown_joins_the_gloo_threads_before_the_interpreter_exits(tmp_path):
    """After a run's collectives, ``shutdown`` destroys the group on every rank: its gloo worker threads are gone
    when it returns. A group kept alive past it (torch binding it as a default argument of a module imported after
    the group was made) was torn down only at interpreter exit, where a worker thread dropping its last work
    needed the GIL of a finalising interpreter and the rank aborted (SIGABRT) after the run had finished."""
    r = torchrun([CHECKS, "teardown", str(tmp_path)])
    assert r.returncode == 0, r.stderr[-2000:]
    ranks = [json.load(open(tmp_path / f"rank{i}.json")) for i in range(2)]
    assert ranks[0]["gathered"] == [{"rank": 0}, {"rank": 1}] and ranks[1]["gathered"] is None
    assert all(x["broadcast"] == [1, 2] for x in ranks)
    assert all(x["threads_before"] for x in ranks)   # gloo runs threads while the group exists ...
    assert all(x["threads_after"] == [] for x in ranks), [x["threads_after"] for x in ranks]   # ... none after


@pytest.mark.slow
def test_a_rank_that_dies_before_the_gather_ends_the_round_without_a_release(tmp_path):
    """The round was accounted when it opened (its one entry); no noisy sum leaves rank 0."""
    torchrun([CHECKS, "dead_rank", str(tmp_path)], env={"DPPO_DIST_TIMEOUT_S": "20"})
    out = json.load(open(tmp_path / "rank0.json"))  # rank 0 got an error from the gather
    assert out["released"] is False and out["seconds"] < 60
    assert [(e["round"], e["users"]) for e in out["ledger"]] == [(0, 4)]
    assert not (tmp_path / "rank1.json").exists()


def assert_same_policy(one_dir, two_dir, rel=1e-5):
    """The final parameters of two runs agree to float32 rounding: max |a - b| <= rel * max(1, max |a|).

    Not bit for bit on every CPU: a rank computes its users' rows in a smaller batch than one process does,
    and a CPU's kernels may then sum in another order (the last bits of a row can differ; the sums on rank 0
    and the noise are the same by construction). On the CPUs the suite was run on the final parameters were
    also bit-identical (same ``policy_sha256``); the README's "Scaling out" names them.
    """
    import torch

    a = torch.load(os.path.join(one_dir, "policy.pt"), weights_only=True)["policy"]
    b = torch.load(os.path.join(two_dir, "policy.pt"), weights_only=True)["policy"]
    assert a.keys() == b.keys()
    for k in a:
        scale = max(1.0, float(a[k].abs().max()))
        assert float((a[k] - b[k]).abs().max()) <= rel * scale, k


def _train(args, run_dir, n=None, algo="dp_pg", users=5):
    base = ["train.py", f"algo={algo}", "privacy.secure_rng=false", f"users_per_round={users}", "eval_episodes=2",
            "progress=false", "env.horizon=40", "checkpoint_every=1", f"hydra.run.dir={run_dir}", *args]
    if n is None:
        r = subprocess.run([sys.executable, *base], cwd=ROOT, capture_output=True, text=True, timeout=240,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    else:
        r = torchrun(base, n=n)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.load(open(os.path.join(run_dir, "summary.json")))


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_two_process_run_equals_the_single_process_run(tmp_path):
    """DP-PG, same seed, seeded noise (2 rounds, 5 users split 3 + 2): each rank clips and sums its users'
    gradients, rank 0 adds the sums and draws the noise once, so the ledger (one entry per round, opened on rank 0
    for every rank's users) and users are the single process's, the final parameters equal to float32 rounding."""
    one = _train(["rounds=2"], str(tmp_path / "one"))
    two = _train(["rounds=2"], str(tmp_path / "two"), n=2)
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["ledger"] == one["ledger"] and len(one["ledger"]) == 2
    assert_same_policy(tmp_path / "one", tmp_path / "two")
    assert two["users_seen"] == one["users_seen"] == 10
    assert not os.path.exists(tmp_path / "two" / "rank1")  # only rank 0 writes the run directory


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
@pytest.mark.parametrize("fused", [pytest.param(None, id="rows"), pytest.param(True, id="fused", marks=pytest.mark.slow)])
def test_two_process_dp_ppo_equals_the_single_process_run(tmp_path, fused):
    """DP-PPO (2 rounds, 5 users split 3 + 2, 2 epochs x 2 minibatches: a minibatch may lie on one rank only):
    each rank clips and sums its users' rows, rank 0 adds the sums and draws the noise once, so the ledger (one
    entry per round, opened on rank 0 for every rank's users) is the single process's and the final parameters
    equal its own to float32 rounding (only the order of the float64 sums of the rows differs). With
    ``algo.fused=true`` every process forms its users' sums by the engine's fused path, the same to float32
    rounding."""
    args = ["rounds=2", "algo.epochs=2", "algo.minibatches=2", *([] if fused is None else ["algo.fused=true"])]
    one = _train(args, str(tmp_path / "one"), algo="dp_ppo")
    two = _train(args, str(tmp_path / "two"), n=2, algo="dp_ppo")
    assert two["world_size"] == 2 and len(one["ledger"]) == 2
    assert two["ledger"] == one["ledger"] and one["ledger"][0]["mechanism"] == "composed_gaussian_sum"
    assert two["users_seen"] == one["users_seen"] == 10
    assert_same_policy(tmp_path / "one", tmp_path / "two")
    import torch

    a, b = (torch.load(tmp_path / d / "policy.pt", weights_only=True)["critic"] for d in ("one", "two"))
    assert a.keys() == b.keys()   # the critic, released like the policy, to the same tolerance
    assert all(float((a[k] - b[k]).abs().max()) <= 1e-5 * max(1.0, float(a[k].abs().max())) for k in a)


@pytest.mark.parametrize("algo", [pytest.param("dp_npg", marks=pytest.mark.slow), pytest.param("dp_rebel", marks=pytest.mark.slow)])
def test_two_process_oracle_learners_equal_the_single_process_run(tmp_path, algo):
    """DP-NPG (ssp oracle) and DP-REBEL (dp_gd oracle): each rank builds its users' regression rows, rank 0's
    oracle clips, sums and noises them once: the same ledger as one process and the same parameters to float32
    rounding (2 rounds)."""
    one = _train(["rounds=2"], str(tmp_path / "one"), algo=algo)
    two = _train(["rounds=2"], str(tmp_path / "two"), n=2, algo=algo)
    assert two["world_size"] == 2 and len(one["ledger"]) == 2
    assert two["ledger"] == one["ledger"]
    assert_same_policy(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["npg", "rebel", "dp_npg oracle=dp_gd", "dp_rebel oracle=ssp"])
def test_two_process_oracle_variants_equal_the_single_process_run(tmp_path, algo):
    name, *extra = algo.split()
    one = _train(["rounds=2", *extra], str(tmp_path / "one"), algo=name)
    two = _train(["rounds=2", *extra], str(tmp_path / "two"), n=2, algo=name)
    assert two["ledger"] == one["ledger"]
    assert_same_policy(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_a_rank_without_users_still_takes_part_in_the_oracle_round(tmp_path):
    """3 processes, 2 users a round: rank 2 holds no user, the release is still the single-process one."""
    one = _train(["rounds=2"], str(tmp_path / "one"), algo="dp_npg", users=2)
    three = _train(["rounds=2"], str(tmp_path / "three"), n=3, algo="dp_npg", users=2)
    assert three["ledger"] == one["ledger"]
    assert_same_policy(tmp_path / "one", tmp_path / "three")


def test_the_backend_is_nccl_with_a_gpu_per_process_and_gloo_otherwise():
    assert pick_backend(cuda=False, devices=0, local_world=2) == "gloo"
    assert pick_backend(cuda=True, devices=1, local_world=2) == "gloo"  # fewer GPUs than processes
    assert pick_backend(cuda=False, devices=0, local_world=2, requested="gloo") == "gloo"
    with pytest.raises(ConfigError):
        pick_backend(cuda=False, devices=0, local_world=2, requested="nccl")
    with pytest.raises(ConfigError):
        pick_backend(cuda=False, devices=0, local_world=2, requested="mpi")
    import torch.distributed as dist

    if dist.is_nccl_available():  # a CUDA build of torch
        assert pick_backend(cuda=True, devices=2, local_world=2) == "nccl"


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["policy.subspace=full", "policy.dim=null"], ["group_size=1", "algo.advantage=to_go"],
                                   ["privacy.noise_correlation=banded"]])
def test_two_process_dp_pg_variants_equal_the_single_process_run(tmp_path, extra):
    """Every parameter (each rank forms its users' clipped sum by the fused path), one rollout per user (tiny
    batches), and noise correlated across rounds (the stream lives on rank 0, which hands every rank its noise std
    for the shrinkage: a rank stepping differently would collect other rollouts in round 2)."""
    one = _train(["rounds=2", *extra], str(tmp_path / "one"))
    two = _train(["rounds=2", *extra], str(tmp_path / "two"), n=2)
    assert two["ledger"] == one["ledger"]
    assert_same_policy(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_non_private_two_process_run_equals_the_single_process_run(tmp_path):
    one = _train(["rounds=2"], str(tmp_path / "one"), algo="pg")
    two = _train(["rounds=2"], str(tmp_path / "two"), n=2, algo="pg")
    assert one["ledger"] == two["ledger"] == []
    assert_same_policy(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_a_two_process_run_killed_mid_run_and_resumed_ends_where_an_uninterrupted_run_ends(tmp_path):
    whole = _train(["rounds=3"], str(tmp_path / "whole"), n=2)
    part = str(tmp_path / "part")
    base = ["train.py", "algo=dp_pg", "privacy.secure_rng=false", "users_per_round=5", "eval_episodes=2",
            "progress=false", "env.horizon=40", "checkpoint_every=1", f"hydra.run.dir={part}", "rounds=3"]
    killed = torchrun(base, env={"DPPO_FAULT_KILL_AT": "after_dump:1"})
    assert killed.returncode != 0 and not os.path.exists(os.path.join(part, "policy.pt"))
    r = torchrun(["train.py", f"resume={part}"])
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = json.load(open(os.path.join(part, "summary.json")))
    assert resumed["rounds_done"] == 3 and resumed["ledger"] == whole["ledger"]
    assert_same_policy(tmp_path / "whole", part)
