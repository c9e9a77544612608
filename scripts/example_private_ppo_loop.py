"""Your own CleanRL-shaped PPO loop made private with ``dppo.make_private`` (Opacus' shape); its ledger equals
``algo=dp_ppo``'s at the same settings. Run: python scripts/example_private_ppo_loop.py --eps 5 --rounds 30"""
from __future__ import annotations

import argparse
import json
import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import dppo

ARGS = dict(seed=0, eps=5.0, delta=1e-5, rounds=30, users_per_round=64, horizon=200, epochs=4, minibatches=2,
            max_grad_norm=0.05, critic_max_grad_norm=0.05, actor_share=0.5, lr=0.05, gamma=0.99, gae_lambda=0.95,
            clip_coef=0.2, seeded_noise=False, ledger="")


def user_episode(env, actor, critic, user: int, seed: int, horizon: int):
    """One user's episode from its own start state and action stream: obs, actions, rewards, log pi, V, V(last)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + user)
    obs, _ = env.reset(seed=seed * 1_000_003 + user)
    rows, terminated = [], False
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


def gae(r, v, last, gamma, lam):
    """GAE over one episode, scaled by its own rms (no statistic mixes users), and the value targets."""
    adv, running, nxt = torch.zeros_like(r), 0.0, torch.cat([v[1:], torch.tensor([last])])
    for t in reversed(range(len(r))):
        running = r[t] + gamma * nxt[t] - v[t] + gamma * lam * running
        adv[t] = running
    return adv / (adv.pow(2).mean().sqrt() + 1e-8), adv + v


def main(a: argparse.Namespace) -> dict:
    torch.manual_seed(a.seed)
    env = gym.make("CartPole-v1", max_episode_steps=a.horizon)
    actor = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    critic = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    _, opt, rounds = dppo.make_private(
        module={"actor": actor, "critic": critic}, eps=a.eps if a.eps >= 0 else None, delta=a.delta,
        optimizer={"actor": torch.optim.Adam(actor.parameters(), lr=a.lr),
                   "critic": torch.optim.Adam(critic.parameters(), lr=a.lr)},
        max_grad_norm={"actor": a.max_grad_norm, "critic": a.critic_max_grad_norm}, releases_per_user=a.epochs,
        share={"actor": a.actor_share, "critic": 1 - a.actor_share}, users_per_round=a.users_per_round,
        rounds=a.rounds, noise_seed=a.seed if a.seeded_noise else None)
    for round_idx, users in enumerate(rounds):          # fresh users; the round is accounted as it starts
        eps_ = [user_episode(env, actor, critic, u, a.seed, a.horizon) for u in users]
        targets = [gae(e[2], e[4], e[5], a.gamma, a.gae_lambda) for e in eps_]
        order = torch.Generator().manual_seed(a.seed * 7919 + round_idx)   # public minibatch order
        for _ in range(a.epochs):
            for mb in torch.tensor_split(torch.randperm(len(users), generator=order), a.minibatches):
                mb = mb.sort().values.tolist()
                actor_loss, value_loss = [], []
                for i in mb:                             # one loss per user, from that user's own steps only
                    obs, act, _, logp_old, _, _ = eps_[i]
                    adv, ret = targets[i]
                    ratio = torch.exp(torch.log_softmax(actor(obs), -1).gather(-1, act[:, None]).squeeze(-1) - logp_old)
                    clipped = ratio.clamp(1 - a.clip_coef, 1 + a.clip_coef)
                    actor_loss.append(-torch.min(ratio * adv.float(), clipped * adv.float()).mean())
                    value_loss.append(0.5 * ((critic(obs).squeeze(-1) - ret.float()) ** 2).mean())
                ids = [users[i] for i in mb]
                opt["actor"].step(torch.stack(actor_loss), ids)
                opt["critic"].step(torch.stack(value_loss), ids)
        print(f"round {round_idx}: (eps, delta) spent {opt['actor'].privacy_spent()}; diag/return "
              f"{np.mean([float(e[2].sum()) for e in eps_]):.1f} (raw: not covered by the guarantee)")
    spent = opt["actor"].privacy_spent()
    out = {"ledger": opt["actor"].engine.privacy.ledger.entries, "seeded_noise": a.seeded_noise,
           "spent": None if math.isinf(spent[0]) else list(spent)}   # released and public only
    if a.ledger:
        with open(a.ledger, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, v in ARGS.items():
        flag = f"--{k.replace('_', '-')}"
        parser.add_argument(flag, action="store_true") if isinstance(v, bool) else parser.add_argument(
            flag, type=type(v), default=v)
    main(parser.parse_args())
