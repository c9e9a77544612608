"""Threads chosen for the work (``threads``, ``dppo/training/threads.py``): a small policy trains on one torch thread
unless the user asks for more, an ``OMP_NUM_THREADS`` in the environment wins over ``auto``, a large network keeps
torch's own count, and the caller's count is restored after training."""
import pytest
import torch
from torch import nn

import dppo
from dppo.errors import ConfigError
from dppo.training.callbacks import Callback
from dppo.training.threads import AUTO_PARAMETERS, choose_threads, torch_threads


def test_auto_takes_one_thread_for_a_small_policy_and_leaves_a_large_one_to_torch(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    small, large = nn.Linear(4, 64), nn.Linear(AUTO_PARAMETERS // 1000, 1000)
    assert choose_threads("auto", small) == 1
    assert choose_threads("auto", small, large) is None          # the networks together size the work
    assert choose_threads(3, large) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads("auto", small) is None                  # the user's environment wins over auto


@pytest.mark.parametrize("value", [0, -1, "two", 1.5, True])
def test_a_bad_threads_value_is_one_line_naming_the_key(value):
    with pytest.raises(ConfigError) as err:
        choose_threads(value)
    assert "threads" in str(err.value) and "\n" not in str(err.value)


def test_the_count_is_set_for_the_block_and_restored_after_it():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with torch_threads(target):
        assert torch.get_num_threads() == target
    assert torch.get_num_threads() == before


class _Threads(Callback):
    def __init__(self):
        self.seen = []

    def on_round_end(self, trainer, round_idx, metrics):
        self.seen.append(torch.get_num_threads())
        return True


def test_a_run_trains_on_the_chosen_threads_and_gives_the_callers_count_back(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for value, expect in (("auto", 1), (2, 2)):
            cb = _Threads()
            dppo.train(["algo=dp_pg", "rounds=2", "users_per_round=2", "group_size=2", "env.horizon=20",
                        "eval_episodes=1", "progress=false", f"threads={value}"], callbacks=[cb])
            assert cb.seen == [expect, expect]
            assert torch.get_num_threads() == 2
        with pytest.raises(ConfigError):
            dppo.train(["algo=dp_pg", "rounds=1", "threads=0", "progress=false"])
    finally:
        torch.set_num_threads(before)
