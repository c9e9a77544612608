"""scripts/build_public_pretrained.py: the pretraining runs on the public simulator and what it writes is what the
fine-tuning file loads (the shipped policy's shapes, config and provenance)."""
import importlib.util
import json
import pathlib

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_short_pretraining_writes_a_policy_shaped_and_recorded_like_the_shipped_one(tmp_path):
    spec = importlib.util.spec_from_file_location("build_public_pretrained",
                                                  ROOT / "scripts" / "build_public_pretrained.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    overrides = [*mod.PRETRAINED["cartpole_long_pole"], "rounds=3", "eval_episodes=1"]
    out = pathlib.Path(mod.build("cartpole_long_pole", overrides, root=str(tmp_path)))
    made = torch.load(out / "policy.pt", weights_only=True)
    shipped = torch.load(ROOT / "assets" / "pretrained" / "cartpole_long_pole" / "policy.pt", weights_only=True)
    assert {k: v.shape for k, v in made["policy"].items()} == {k: v.shape for k, v in shipped["policy"].items()}
    assert made["provenance"]["env_id"] == shipped["provenance"]["env_id"] == "dppo/CartPolePhysics-v1"
    assert made["config"]["env"]["kwargs"] == shipped["config"]["env"]["kwargs"] == {"length": 1.0}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"]["users"] > 0 and summary["eps"] is None     # public steps, no privacy spent
