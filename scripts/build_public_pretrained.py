"""Build the shipped public-pretraining policies: ``assets/pretrained/<name>/`` (policy.pt + summary.json).

    python scripts/build_public_pretrained.py            # every entry of PRETRAINED (about 30 s each)

Each entry is a non-private run of a ``conf/experiment`` file on a *public simulator* (simulated episodes,
nobody's data), e.g. ``cartpole_public_pretrain``: PPO on ``dppo/CartPolePhysics-v1`` with a pole twice as
long as CartPole-v1's. The run's ``policy.pt`` (weights, config, provenance) and ``summary.json`` (its env
steps: the public env steps of any run that starts from it) are copied into ``assets/pretrained/<name>/``;
a private run starts from it with ``policy.init_from=assets/pretrained/<name>/policy.pt``
(``conf/experiment/cartpole_dp_ppo_public_init.yaml``). Seeded runs repeat on one machine only, so the
shipped files are the reference and this script is how they were made.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# name -> the pretraining run's overrides
PRETRAINED = {"cartpole_long_pole": ["+experiment=cartpole_public_pretrain", "seed=1000"]}


def build(name: str, overrides: list[str], root: str = ROOT) -> str:
    """Run the pretraining, copy its policy.pt and summary.json into ``root/assets/pretrained/<name>/``."""
    import dppo

    out = os.path.join(root, "assets", "pretrained", name)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dppo.make_config([*overrides, "progress=false", "logger.tensorboard=false"])
        summary = dppo.train(cfg, run_dir=tmp)
        os.makedirs(out, exist_ok=True)
        for f in ("policy.pt", "summary.json"):
            shutil.copyfile(os.path.join(tmp, f), os.path.join(out, f))
    print(f"{name}: final return {summary['final_return']:.1f} on {cfg.env.id} {dict(cfg.env.get('kwargs') or {})}, "
          f"{summary['env_steps']['users']:,} public env steps of training -> {out}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(PRETRAINED), help="build only these entries (default: all)")
    args = ap.parse_args()
    for name, overrides in PRETRAINED.items():
        if not args.only or name in args.only:
            build(name, overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
