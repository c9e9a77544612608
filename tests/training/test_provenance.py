"""Provenance travels with the policy: ``policy.pt`` (and every form ``policy.init_from`` accepts) records the
users its training consumed, so fine-tuning from any form skips them; a bare state_dict is refused unless
its users are stated (``policy.init_users_offset``)."""
import json
import os

import pytest
import torch

import dppo
from dppo.errors import ConfigError
from dppo.training import provenance
from dppo.training.journal import JOURNAL_NAME, UserJournal
from tests.cli_helpers import run_cli

TINY = ["rounds=2", "users_per_round=3", "group_size=2", "eval_episodes=1", "progress=false", "env.horizon=30",
        "privacy.secure_rng=false"]


def _taken(run_dir):
    return [u for e in UserJournal.read(os.path.join(run_dir, JOURNAL_NAME)) if e["event"] == "take"
            for u in e["users"]]


def _policy_file(run_dir):
    return torch.load(os.path.join(run_dir, "policy.pt"), weights_only=True)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("pre"))
    dppo.train(["algo=dp_pg", *TINY], run_dir=run)
    return run


def test_policy_pt_records_the_users_seed_and_population_of_its_training(pretrained):
    rec = _policy_file(pretrained)["provenance"]
    assert provenance.is_record(rec) and rec["seed"] == 0 and rec["algo"] == "dp_pg"
    (entry,) = rec["consumed"]
    assert entry["population"] == {"kind": "ids", "env_id": "CartPole-v1", "size": None}
    assert provenance.from_ranges(entry["users"]) == sorted(_taken(pretrained)) == list(range(6))


@pytest.mark.parametrize("form", ["policy.pt", "run_dir", "checkpoint"])
def test_fine_tuning_from_any_form_never_takes_a_pretraining_user(pretrained, tmp_path, form):
    source = {"policy.pt": os.path.join(pretrained, "policy.pt"), "run_dir": pretrained,
              "checkpoint": sorted(__import__("glob").glob(os.path.join(pretrained, "checkpoints", "ckpt_*.pt")))[-1]}
    fine = str(tmp_path / "fine")
    dppo.train(["algo=dp_pg", *TINY, f"policy.init_from={source[form]}"], run_dir=fine)
    assert not set(_taken(fine)) & set(_taken(pretrained))
    assert _taken(fine) == list(range(6, 12))        # the stream continues after the pretraining ids


def test_a_fine_tuned_policy_carries_its_parents_users_too(pretrained, tmp_path):
    fine, third = str(tmp_path / "fine"), str(tmp_path / "third")
    dppo.train(["algo=dp_pg", *TINY, f"policy.init_from={pretrained}/policy.pt"], run_dir=fine)
    rec = _policy_file(fine)["provenance"]
    assert provenance.from_ranges(rec["consumed"][0]["users"]) == list(range(12))
    dppo.train(["algo=dp_pg", *TINY, f"policy.init_from={fine}/policy.pt"], run_dir=third)
    assert min(_taken(third)) == 12


def test_a_bare_state_dict_is_refused_unless_its_users_are_stated(pretrained, tmp_path):
    bare = str(tmp_path / "bare.pt")
    torch.save(_policy_file(pretrained)["policy"], bare)
    r = run_cli(["algo=dp_pg", *TINY, f"policy.init_from={bare}", f"hydra.run.dir={tmp_path / 'refused'}"])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "bare state_dict" in lines[0]
    assert "policy.init_users_offset" in lines[0] and not (tmp_path / "refused").exists()
    run = str(tmp_path / "offset")
    dppo.train(["algo=dp_pg", *TINY, f"policy.init_from={bare}", "policy.init_users_offset=6"], run_dir=run)
    assert min(_taken(run)) == 6
    assert provenance.from_ranges(_policy_file(run)["provenance"]["consumed"][0]["users"]) == list(range(12))


def test_a_multi_pass_pretraining_run_consumed_its_whole_population(tmp_path):
    pre, fine = str(tmp_path / "pre"), str(tmp_path / "fine")
    dppo.train(["algo=dp_pg", *TINY, "privacy.multi_pass=true", "privacy.population_size=20", "eps=8"], run_dir=pre)
    (entry,) = _policy_file(pre)["provenance"]["consumed"]
    assert entry["all"] and entry["users"] == [[0, 20]]     # no per-round sample revealed: everyone, once
    dppo.train(["algo=dp_pg", *TINY, f"policy.init_from={pre}/policy.pt"], run_dir=fine)
    assert min(_taken(fine)) == 20
    with pytest.raises(ConfigError, match="cannot exclude them"):
        dppo.train(["algo=dp_pg", *TINY, f"policy.init_from={pre}/policy.pt", "privacy.multi_pass=true",
                     "privacy.population_size=30", "eps=8"], run_dir=str(tmp_path / "again"))


def test_bandit_members_are_excluded_and_counted_against_the_population(tmp_path):
    """A finite population (the bandit's contexts): the fine-tuning run burns the pretraining members and
    the population check counts them before round 0."""
    pre, fine = str(tmp_path / "pre"), str(tmp_path / "fine")
    bandit = ["env=bandit", "policy=loglinear", "env.population=20", "group_size=2", "users_per_round=4",
              "eval_episodes=1", "progress=false", "privacy.secure_rng=false"]
    dppo.train(["algo=dp_pg", *bandit, "rounds=2"], run_dir=pre)
    rec = _policy_file(pre)["provenance"]
    assert rec["consumed"][0]["population"] == {"kind": "members", "env_id": "ContextualBandit", "size": 20}
    dppo.train(["algo=dp_pg", *bandit, "rounds=2", f"+policy.init_from={pre}/policy.pt"], run_dir=fine)
    assert not set(_taken(fine)) & set(_taken(pre))
    with pytest.raises(ConfigError, match="needs 16 more users .* has 20, 8 of them already used or excluded"):
        dppo.train(["algo=dp_pg", *bandit, "rounds=4", f"+policy.init_from={pre}/policy.pt"],
                   run_dir=str(tmp_path / "too_many"))


def test_prompt_members_are_keyed_contents_found_in_any_file_order_or_seed(tmp_path):
    """A prompt's member id is the keyed digest of its content: another run, whose rows come in another file
    in another order under another seed, finds the very same prompts, and nothing else; without the key
    the digests match nothing (no dictionary test on a shared record)."""
    from dppo.envs.prompts import PromptsEnv
    from dppo.envs.tasks.addition import write_prompts
    from dppo.training import secret
    from dppo.training.provenance import Population, entry

    path, moved = str(tmp_path / "p.jsonl"), str(tmp_path / "renamed.jsonl")
    write_prompts(path, public=4, private=40, seed=1)
    rows = [json.loads(line) for line in open(path)]
    with open(moved, "w") as f:   # the same rows, reversed, under another name
        f.writelines(json.dumps(r) + "\n" for r in reversed(rows))
    a = PromptsEnv(path, "dppo.envs.tasks.addition.digit_reward", seed=0)
    b = PromptsEnv(moved, "dppo.envs.tasks.addition.digit_reward", seed=7)
    pop_a = Population(a, key=secret.new_key())
    users = [0, 1, 2, 9]
    e = entry(pop_a.identity, pop_a.member_ids(users))
    assert len(e["members"]) == 4 and e["users"] == []
    found = Population(b, key=secret.new_key()).users_of_content(e)
    assert sorted(r["prompt"] for r in b.user_rows(found)) == sorted(r["prompt"] for r in a.user_rows(users))
    other_key = {**e, "population": {**e["population"], "key": secret.new_key()}}
    assert Population(b, key=secret.new_key()).users_of_content(other_key) == []
    everyone = entry(pop_a.identity, pop_a.member_ids(range(40)))
    assert sorted(Population(b).users_of_content(everyone)) == list(range(40))   # every private prompt, once


def test_a_shareable_record_withholds_a_content_population(tmp_path):
    """``policy.pt``'s record of private rows says only that it exists: no key, digest or count."""
    from dppo.training.provenance import public_record, withheld

    content = {"population": {"kind": "content", "env_id": "prompts:x", "key": "k" * 64},
               "users": [], "members": ["a", "b"], "all": False, "source": "training"}
    stream = provenance.entry({"kind": "ids", "env_id": "CartPole-v1", "size": None}, range(6))
    rec = {"format": provenance.FORMAT, "seed": 0, "algo": "dp_pg", "consumed": [content, stream]}
    shared = public_record(rec)
    assert withheld(shared) and not withheld(rec)
    assert shared["consumed"][0] == {"population": {"kind": "content", "env_id": "prompts:x"}, "users": [],
                                     "all": False, "source": "training", "withheld": True}
    assert shared["consumed"][1] == stream   # public ids stay


def test_ranges_round_trip():
    ids = [0, 1, 2, 5, 7, 8, 20]
    assert provenance.to_ranges(ids) == [[0, 3], [5, 6], [7, 9], [20, 21]]
    assert provenance.from_ranges(provenance.to_ranges(ids)) == ids
    assert provenance.union_ranges([[0, 3]], [[2, 5], [9, 10]]) == [[0, 5], [9, 10]]
