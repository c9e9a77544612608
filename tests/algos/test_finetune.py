"""Private fine-tuning: ``policy.init_from`` takes a run directory, a run's checkpoint or a bare state_dict;
a frozen body stays bit-identical (only trainable parameters get gradients and noise, and the ledger
records the noised dimension); the fine-tuning run never reuses a user of the pretraining run."""
import os

import torch

import dppo
from dppo.training.checkpoint import load_latest_checkpoint

TINY = ["rounds=2", "users_per_round=3", "group_size=2", "eval_episodes=1", "progress=false", "env.horizon=40",
        "privacy.secure_rng=false"]


def final_state(run_dir):
    state, _ = load_latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    return state


def test_fine_tuning_from_a_run_freezes_the_body_noises_the_head_and_uses_new_users(tmp_path):
    pre, fine = str(tmp_path / "pre"), str(tmp_path / "fine")
    dppo.train(["algo=pg", *TINY, "policy.subspace=full", "policy.dim=null"], run_dir=pre)
    # algo.shrink=false: with 3 users a round the James-Stein step is 0 (noise dominates); this test is about
    # which parameters get the noised step, so it takes the plain one
    summary = dppo.train(["algo=dp_pg", "eps=5", *TINY, f"policy.init_from={pre}", "policy.freeze=[body]",
                          "policy.subspace=full", "policy.dim=null", "algo.shrink=false"], run_dir=fine)
    a, b = final_state(pre), final_state(fine)
    pa, pb = a["learner"]["policy"], b["learner"]["policy"]
    for k in pa:
        if k.startswith("body."):
            assert torch.equal(pa[k], pb[k]), k          # frozen: bit-identical to the pretrained body
    assert not torch.equal(pa["head.weight"], pb["head.weight"])
    head_dim = pa["head.weight"].numel() + pa["head.bias"].numel()
    assert [e["dim"] for e in summary["ledger"]] == [head_dim, head_dim]
    assert not set(a["sampler"]["used"]) & set(b["sampler"]["used"])


def test_init_from_accepts_a_checkpoint_file_and_a_bare_state_dict(tmp_path):
    pre = str(tmp_path / "pre")
    dppo.train(["algo=pg", *TINY], run_dir=pre)
    ckpts = sorted(os.listdir(os.path.join(pre, "checkpoints")))
    ckpt = os.path.join(pre, "checkpoints", [c for c in ckpts if c.endswith(".pt")][-1])
    bare = str(tmp_path / "bare.pt")
    torch.save(final_state(pre)["learner"]["policy"], bare)
    for source, extra in ((ckpt, []), (bare, ["policy.init_users_offset=6"])):   # a bare one: its users stated
        out = str(tmp_path / ("run_" + os.path.basename(source)))
        summary = dppo.train(["algo=pg", *TINY, "rounds=1", f"policy.init_from={source}", "policy.freeze=[body]",
                              "policy.subspace=full", "policy.dim=null", *extra], run_dir=out)
        assert summary["rounds_done"] == 1
        start = final_state(pre)["learner"]["policy"]
        assert torch.equal(final_state(out)["learner"]["policy"]["body.0.weight"], start["body.0.weight"])


def test_the_shipped_public_pretraining_loads_from_any_directory_and_its_users_are_skipped(tmp_path, monkeypatch):
    from dppo.build import load_init_source

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rel = "assets/pretrained/cartpole_long_pole/policy.pt"
    shipped = torch.load(os.path.join(root, rel), weights_only=True)
    monkeypatch.chdir(tmp_path)                        # a relative init_from falls back to the repository root
    weights, record = load_init_source(rel)
    assert all(torch.equal(weights[k], shipped["policy"][k]) for k in shipped["policy"])
    assert record["consumed"][0]["population"]["env_id"] == "dppo/CartPolePhysics-v1"   # a public simulator's
    assert "critic" in shipped                          # the fine-tuning's critic starts from the pretraining's
    summary = dppo.train(["+experiment=cartpole_dp_ppo_public_init", "rounds=1", "users_per_round=2",
                          "algo.epochs=1", "env.horizon=20", "eval_episodes=1", "progress=false",
                          "privacy.secure_rng=false"], run_dir=str(tmp_path / "fine"))
    assert summary["rounds_done"] == 1 and summary["epsilon_spent"] == 5.0
    used = final_state(str(tmp_path / "fine"))["sampler"]["used"]
    assert min(used) >= 200                            # its 200 simulated users' ids are never reused


def test_an_actor_critic_source_starts_the_critic_too_and_a_misfit_critic_is_one_clear_error(tmp_path):
    import pytest

    from dppo.build import build
    from dppo.errors import ConfigError
    from dppo.saved_run import load

    pre = str(tmp_path / "pre")
    ppo = ["algo=ppo", "rounds=2", "users_per_round=2", "group_size=1", "eval_episodes=1", "progress=false",
           "env.horizon=30", "policy.hidden_sizes=[8]", "algo.critic_hidden_sizes=[8]"]
    dppo.train(ppo, run_dir=pre)
    saved = torch.load(os.path.join(pre, "policy.pt"), weights_only=True)
    trained = final_state(pre)["learner"]["critic"]
    assert all(torch.equal(saved["critic"][k], trained[k]) for k in trained)     # policy.pt carries the critic
    assert all(torch.equal(load(pre + "/policy.pt").learner.critic.state_dict()[k], trained[k]) for k in trained)
    for source in (pre, os.path.join(pre, "policy.pt")):                           # a run directory or its policy.pt
        cfg = dppo.make_config([*ppo, "algo=dp_ppo", "eps=5", f"policy.init_from={source}"])
        critic = build(cfg).learner.critic.state_dict()
        assert all(torch.equal(critic[k], trained[k]) for k in trained)
    fresh = build(dppo.make_config([*ppo, "algo=dp_ppo", "eps=5"])).learner.critic.state_dict()
    assert not all(torch.equal(fresh[k], trained[k]) for k in trained)
    with pytest.raises(ConfigError, match="init_from's critic does not fit"):
        build(dppo.make_config([*ppo, "algo=dp_ppo", "eps=5", f"policy.init_from={pre}",
                                "algo.critic_hidden_sizes=[4]"]))
