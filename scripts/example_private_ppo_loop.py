"""Your own PPO loop, CleanRL-shaped, made private with dppo's release: users, per-user gradients, the round's release.

Nothing here is the learner behind ``algo=dp_ppo``; only three public pieces of dppo are used, as Opacus'
``make_private`` serves a supervised loop:

* ``dppo.policies.per_user_grads.per_user_gradients``: each user's gradient of its own objective (here CleanRL's
  clipped surrogate and value loss, means over the user's own steps) from one backward pass;
* ``dppo.privacy.composed.composed_sums``: the round's release, opened (and accounted: one ledger entry) before
  anything leaves, then one noisy clipped sum per part and minibatch; each user is in one minibatch per epoch,
  so in 2 x epochs releases, calibrated together to (eps, delta) for its round (the twin without ``--eps``);
* ``PrivacyContext.spent()``: the accountant's (eps, delta) of the run (one-pass users: parallel composition).

The ledger equals the one ``python train.py algo=dp_ppo`` writes with the same eps, delta, users per round,
epochs, clips and actor share (tests/scripts/test_example_private_ppo_loop.py checks it).

    python scripts/example_private_ppo_loop.py --eps 5 --rounds 30
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dppo.policies.per_user_grads import per_user_gradients
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.composed import composed_sums


@dataclass
class Args:
    seed: int = 0
    """seeds the users' episodes and the minibatch order (and the noise with --seeded-noise)"""
    eps: float | None = 5.0
    """per-round (= run, one-pass users) epsilon; a negative value runs the non-private twin"""
    delta: float = 1e-5
    rounds: int = 30
    """rounds of fresh users"""
    users_per_round: int = 64
    horizon: int = 200
    """steps of a user's episode at most"""
    epochs: int = 4
    minibatches: int = 2
    max_grad_norm: float = 0.05
    """per-user clip of the actor's gradient (the critic's: critic_max_grad_norm)"""
    critic_max_grad_norm: float = 0.05
    actor_share: float = 0.5
    """the actor's share of the round's budget"""
    lr: float = 0.05
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    seeded_noise: bool = False
    """draw the noise from a seeded generator (reproducible, labelled; the OS CSPRNG otherwise)"""
    ledger: str | None = None
    """write the ledger here (JSON)"""


def user_episode(env, actor, critic, user: int, seed: int, horizon: int):
    """One user's episode from its own start state and action stream: obs, actions, rewards, log pi, V, V(last)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + user)
    obs, _ = env.reset(seed=seed * 1_000_003 + user)
    rows = []
    for _ in range(horizon):
        o = torch.as_tensor(obs, dtype=torch.float32)
        with torch.no_grad():
            logp = torch.log_softmax(actor(o), -1)
            a = int(torch.multinomial(logp.exp(), 1, generator=gen))
            v = float(critic(o))
        obs, r, terminated, truncated, _ = env.step(a)
        rows.append((o, a, float(r), float(logp[a]), v))
        if terminated or truncated:
            break
    with torch.no_grad():
        last = 0.0 if terminated else float(critic(torch.as_tensor(obs, dtype=torch.float32)))
    o, a, r, lp, v = zip(*rows)
    return torch.stack(o), torch.tensor(a), torch.tensor(r), torch.tensor(lp), torch.tensor(v), last


def advantages(r, v, last, gamma, lam):
    """GAE over one episode, then scaled by its own rms (no statistic mixes users); the value targets."""
    adv, running = torch.zeros_like(r), 0.0
    nxt = torch.cat([v[1:], torch.tensor([last])])
    for t in reversed(range(len(r))):
        running = r[t] + gamma * nxt[t] - v[t] + gamma * lam * running
        adv[t] = running
    returns = adv + v
    return adv / (adv.pow(2).mean().sqrt() + 1e-8), returns


def main(args: Args) -> dict:
    torch.manual_seed(args.seed)
    env = gym.make("CartPole-v1", max_episode_steps=args.horizon)
    actor = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    critic = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizers = {"actor": torch.optim.Adam(actor.parameters(), lr=args.lr),
                  "critic": torch.optim.Adam(critic.parameters(), lr=args.lr)}
    eps = args.eps if args.eps is not None and args.eps >= 0 else None
    privacy = PrivacyContext(eps, args.delta, noise=NoiseSource(args.seed, secure=False) if args.seeded_noise else None)
    release = composed_sums(privacy, parts={"actor": (args.epochs, args.actor_share),
                                            "critic": (args.epochs, 1.0 - args.actor_share)})
    clips = {"actor": args.max_grad_norm, "critic": args.critic_max_grad_norm}

    def surrogate(obs, act, adv, logp_old):   # CleanRL's clipped objective, one value per step (to ascend)
        logp = torch.log_softmax(actor(obs), -1).gather(-1, act[:, None]).squeeze(-1)
        ratio = torch.exp(logp - logp_old)
        return torch.min(ratio * adv, ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef) * adv)

    def value_loss(obs, returns):             # minus CleanRL's value loss (to ascend)
        return -0.5 * (critic(obs).squeeze(-1) - returns) ** 2

    returns_seen = []
    for round_idx in range(args.rounds):
        users = list(range(round_idx * args.users_per_round, (round_idx + 1) * args.users_per_round))  # fresh users
        episodes = [user_episode(env, actor, critic, u, args.seed, args.horizon) for u in users]
        returns_seen.append(float(np.mean([float(e[2].sum()) for e in episodes])))
        targets = [advantages(e[2], e[4], e[5], args.gamma, args.gae_lambda) for e in episodes]
        release.open_round(round_idx, users, (clips["actor"], clips["critic"]))   # accounted here, once
        order = torch.Generator().manual_seed(args.seed * 7919 + round_idx)        # public minibatch order
        for _ in range(args.epochs):
            for mb in torch.tensor_split(torch.randperm(len(users), generator=order), args.minibatches):
                mb = mb.sort().values.tolist()
                user_index = torch.cat([torch.full((len(episodes[i][0]),), k) for k, i in enumerate(mb)])
                weight = torch.cat([torch.full((len(episodes[i][0]),), 1.0 / len(episodes[i][0])) for i in mb])
                obs = torch.cat([episodes[i][0] for i in mb])
                rows = {"actor": (surrogate, actor, (obs, torch.cat([episodes[i][1] for i in mb]),
                                                     torch.cat([targets[i][0] for i in mb]).float(),
                                                     torch.cat([episodes[i][3] for i in mb]))),
                        "critic": (value_loss, critic, (obs, torch.cat([targets[i][1] for i in mb]).float()))}
                for part, (objective, module, inputs) in rows.items():
                    g = per_user_gradients(module, inputs, weight, user_index, objective=objective,
                                           num_users=len(mb))
                    noisy_sum, _ = release.release_sum(g, [users[i] for i in mb], clips[part], part=part)
                    step = (noisy_sum / len(mb)).float()
                    lo = 0
                    for p in module.parameters():   # ascend: the optimizer descends the negated direction
                        p.grad = -step[lo:lo + p.numel()].reshape(p.shape)
                        lo += p.numel()
                    optimizers[part].step()
        spent = privacy.spent() if privacy.private else (None, None)
        print(f"round {round_idx}: (eps, delta) spent {spent} (accountant); diag/return {returns_seen[-1]:.1f} "
              "(the round's users' mean return: a raw statistic, not covered by the guarantee)")
    out = {"ledger": privacy.ledger.entries, "spent": list(privacy.spent()) if privacy.private else None,
           "seeded_noise": args.seeded_noise}   # released and public only: the raw returns stay on the console
    if args.ledger:
        with open(args.ledger, "w") as f:
            json.dump(out, f, indent=1)
    return out


def parse(argv=None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in fields(Args):
        kind = {"bool": None, "int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        if f.type == "bool":
            parser.add_argument(f"--{f.name.replace('_', '-')}", action="store_true")
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind or str, default=f.default)
    return Args(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main(parse())
