"""Audit of the DP-REBEL and DP-NPG rounds: their private least-squares oracle, built from the algorithm's
default private oracle (``default_oracle``, with the oracle class's defaults: the family's settings) and called as the learner calls
it, ``oracle.solve([(x_i, y_i) per user], privacy=..., round=...)``.

Everything private in such a round happens inside that call (the rows x_i, y_i of a user depend on
that user alone; the parameter update is post-processing), so it is the smallest function holding
the whole privatization; the canary is injected as a row rather than through rollouts.
Neighbours: m users with fixed random rows; the canary row is x = x_bound e1 with y = +y_bound (D)
or -y_bound (D'). Two oracle setups are driven:
- ``dp_gd`` with one step from w = 0 and no projection (DP-REBEL): the canary's gradient -2 y' x'
  (normalized units, norm 2) is clipped to -+C e1, the replace-one worst case 2C. That step is
  affine in its noise, so ``StackedNoise`` gives ``chunk`` independent releases per call; the test
  is the projection of the released w on e1.
- ``ssp`` with a public Gram matrix (DP-NPG: the Fisher at public states; only b~ is released): the
  canary's moment +-e1 is clipped to +-b_clip e1, the replace-one worst case 2 b_clip. The release is
  ``ssp_release(..., public_gram=True)`` on the oracle's own per-user moments (``prepare(D)``), ``chunk``
  stacked releases per call; the test is b~ projected on e1 (the solve with the public Gram matrix is
  post-processing).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.audit.trials import StackedNoise, trial_context
from dppo.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf" / "algo"


def config_oracle(algo: str):
    """(oracle, its name): the private oracle ``conf/algo/<algo>.yaml``'s learner runs by default (its
    ``default_oracle``, with the oracle class's defaults)."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    from dppo.oracles import make_oracle

    cfg = OmegaConf.load(CONF / f"{algo}.yaml")
    cfg = cfg.algo if "algo" in cfg else cfg  # a global-package file (it also sets run keys) nests its learner
    name = get_class(cfg._target_).default_oracle(True, 8)
    return make_oracle(name), name


def audit_oracle_round(eps: float, delta: float = 1e-5, trials: int = 1_000_000, *, algo: str = "dp_rebel",
                       users: int = 10, dim: int = 8, seed: int = 0, chunk: int = 50_000) -> MechanismAudit:
    """``trials`` releases of ``algo``'s oracle (half on D, half on D')."""
    started = time.perf_counter()
    oracle, name = config_oracle(algo)
    stacked = name == "dp_gd" and oracle.steps == 1 and oracle.radius is None
    if not stacked and name != "ssp":
        raise ConfigError(f"the {algo} audit drives a one-step, unprojected dp_gd oracle or ssp; the config has "
                          f"{name} (steps={getattr(oracle, 'steps', None)}, radius={getattr(oracle, 'radius', None)})")
    gen = torch.Generator().manual_seed(seed + 23)
    rows = []
    for _ in range(users - 1):
        x = torch.rand(1, dim, generator=gen, dtype=torch.float64) * 2 - 1
        rows.append((x / max(1.0, float(x.norm())) * oracle.x_bound,
                     (torch.rand(1, generator=gen, dtype=torch.float64) * 2 - 1) * oracle.y_bound))
    e1 = torch.zeros(1, dim, dtype=torch.float64)
    e1[0, 0] = 1.0
    d_null = [(e1 * oracle.x_bound, torch.tensor([oracle.y_bound]))] + rows
    d_alt = [(e1 * oracle.x_bound, torch.tensor([-oracle.y_bound]))] + rows
    if not stacked:
        return _ssp_public_gram(oracle, algo, d_null, d_alt, eps, delta, trials, seed, started)
    noise = StackedNoise(chunk, seed)
    privacy = trial_context(eps, delta, noise)
    null, alt = [], []
    for r in range(max(1, trials // (2 * chunk))):
        null.append(oracle.solve(d_null, privacy=privacy, round=2 * r)[:, 0])
        alt.append(oracle.solve(d_alt, privacy=privacy, round=2 * r + 1)[:, 0])
    claim = same_claim([privacy.spent()])
    return conclude(f"{algo}_round", f"conf/algo/{algo}.yaml -> make_oracle('{name}').solve", claim,
                    torch.cat(null).numpy(), torch.cat(alt).numpy(), started)


def _ssp_public_gram(oracle, algo, d_null, d_alt, eps, delta, trials, seed, started, chunk=20_000) -> MechanismAudit:
    from dppo.privacy.mechanisms import ssp_release

    chunk = max(1, min(chunk, trials // 2))
    moments = [oracle.prepare(d).per_user_moments() for d in (d_null, d_alt)]
    privacy = trial_context(eps, delta, StackedNoise(chunk, seed))
    null, alt = [], []
    for r in range(max(1, trials // (2 * chunk))):
        for side, out in ((0, null), (1, alt)):
            _, b, _ = ssp_release(privacy, None, moments[side], round=2 * r + side, eps=eps, delta=delta,
                                  gram_share=oracle.gram_share, b_clip=oracle.b_clip, public_gram=True)
            out.append(b[..., 0].numpy())
    return conclude(f"{algo}_round", f"conf/algo/{algo}.yaml -> ssp_release(prepare(D).per_user_moments(), "
                    "public_gram=True) (b~)", same_claim([privacy.spent()]), np.concatenate(null),
                    np.concatenate(alt), started)
