"""``env=prompts``: a finite population of users, one prompt per user, and a programmatic reward.

The prompts file (``env.path``, JSONL or gzip-compressed JSONL) has one row per prompt: the prompt text
under ``prompt_key`` and any extra columns, which are passed to the reward. Rows are split into a
*public* part (evaluation and supervised fine-tuning; anything may be logged about them) and a *private*
part (the users of RL): by the ``split`` column (values ``public`` / ``private``) when the file has one,
else the first ``public_size`` rows of a seeded shuffle are public.

Users: user id u (u = 0, 1, ... from the one-pass sampler) is private row ``order[u]`` of a seeded
permutation; an id past the private population is refused (``PrivacyError``), so no prompt is ever used
twice and evaluation never touches a private row. This is a one-step ("bandit-like") environment: the
context is the prompt, the action is a whole completion.

Rewards: a Python callable named by a dotted path (``env.reward=my_module.my_reward``) or a
``{_target_: ..., **kwargs}`` spec, called with TRL's convention
``reward(prompts=[...], completions=[...], **columns) -> list[float]`` (columns as lists aligned with
the completions), then clipped to ``[-reward_bound, reward_bound]`` before anything else sees them.
A target that cannot be imported is a ``ConfigError``; a wrong-length, non-numeric or NaN/inf result is a
``DataError`` raised before anything of the round is released (both: one line, exit 2).
"""
from __future__ import annotations

import functools
import gzip
import json
import os

import numpy as np

from dppo.errors import ConfigError, DataError, PrivacyError


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_file(path: str) -> str:
    """``path`` as given (absolute or relative to the working directory), else relative to the repository
    root (so the shipped ``assets/`` work from any directory)."""
    if path and not os.path.isfile(path) and not os.path.isabs(path):
        cand = os.path.join(REPO_ROOT, path)
        if os.path.isfile(cand):
            return cand
    return path


def load_rows(path: str) -> list[dict]:
    """Rows of a JSONL file (``.gz``: gzip); one line error on a missing file or a bad line."""
    path = resolve_file(path)
    if not path or not os.path.isfile(path):
        raise ConfigError(f"env.path={path} is not a file; give a JSONL file of prompts (one JSON object a line)")
    opener = gzip.open if path.endswith(".gz") else open
    rows = []
    with opener(path, "rt") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{i}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{i}: each line must be a JSON object")
            rows.append(row)
    return rows


def locate(target: str):
    """The object at a dotted path ``package.module.name`` (the working directory is importable)."""
    import importlib
    import sys

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(target)


def resolve_reward(spec):
    """The reward callable named by a dotted path or a ``{_target_: path, **kwargs}`` mapping."""
    kwargs = {}
    if isinstance(spec, dict):
        spec = dict(spec)
        target = spec.pop("_target_", None)
        kwargs = spec
    else:
        target = spec
    if not isinstance(target, str) or not target:
        raise ConfigError("env.reward must name a callable, e.g. env.reward=my_module.my_reward")
    try:
        fn = locate(target)
    except Exception:  # noqa: BLE001 - import errors of any kind are the user's config
        raise ConfigError(f"env.reward '{target}' cannot be imported; give a dotted path module.function "
                          f"importable from the working directory") from None
    if not callable(fn):
        raise ConfigError(f"env.reward '{target}' is not callable")
    return functools.partial(fn, **kwargs) if kwargs else fn


class PromptsEnv:
    """Prompts as users; the reward and the public / private split (module docstring).

    Args:
        path: JSONL (or ``.jsonl.gz``) file of prompts.
        reward: dotted path of the reward callable, or ``{_target_: ..., **kwargs}``.
        prompt_key: column holding the prompt text.
        split_key: column holding ``public`` / ``private`` (used when present in every row).
        public_size: without a split column, the number of rows (after a seeded shuffle) that are public.
        eval_size: held-out public prompts used for ``eval/return`` (the first ``eval_size`` public rows).
        eval_every: rounds between ``eval/return`` evaluations (0: only the final one).
        eval_samples: sampled completions per evaluation prompt (the mean reward over all of them).
        show_completions: public prompts whose completions are logged as TensorBoard text.
        show_every: rounds between those text logs (0: never).
        seed: seed of the private order and of the shuffle.
    """

    kind = "prompts"
    horizon = 1
    observation_space = None
    action_space = None

    def __init__(self, path: str, reward, *, prompt_key: str = "prompt", split_key: str = "split",
                 public_size: int | None = None, eval_size: int = 256, eval_every: int = 10, eval_samples: int = 4,
                 show_completions: int = 4, show_every: int = 10, seed: int = 0):
        rows = load_rows(path)
        if not rows:
            raise ConfigError(f"env.path={path} has no rows")
        if any(not isinstance(r.get(prompt_key), str) for r in rows):
            raise ConfigError(f"every row of {path} needs a string column '{prompt_key}' (env.prompt_key)")
        self.path, self.prompt_key, self.seed = path, prompt_key, int(seed)
        self.reward_fn = resolve_reward(reward)
        self.reward_name = reward if isinstance(reward, str) else reward.get("_target_")
        if all(split_key in r for r in rows):
            bad = {r[split_key] for r in rows} - {"public", "private"}
            if bad:
                raise ConfigError(f"column '{split_key}' must be 'public' or 'private', found {sorted(bad)[:3]}")
            public = [r for r in rows if r[split_key] == "public"]
            rows_of_private = [i for i, r in enumerate(rows) if r[split_key] == "private"]
        else:
            if public_size is None or not 0 <= public_size <= len(rows):
                raise ConfigError(f"{path} has no '{split_key}' column: set env.public_size (0..{len(rows)})")
            perm = np.random.default_rng([self.seed, 7]).permutation(len(rows))
            public = [rows[i] for i in perm[:public_size]]
            rows_of_private = [int(i) for i in perm[public_size:]]
        private = [rows[i] for i in rows_of_private]
        if not private:
            raise ConfigError(f"{path} has no private prompts (split=private): RL has no users")
        self.columns = sorted({k for r in rows for k in r} - {prompt_key, split_key})
        self.public, self.private = public, private
        self.population = len(private)
        self.eval_size = min(int(eval_size), len(public))
        self.eval_every, self.show_every = int(eval_every), int(show_every)
        if eval_samples < 1:
            raise ConfigError(f"env.eval_samples must be >= 1, got {eval_samples}")
        self.eval_samples = int(eval_samples)
        self.show_completions = min(int(show_completions), self.eval_size)
        self.order = np.random.default_rng([self.seed, 11]).permutation(self.population)
        self.private_rows = np.asarray(rows_of_private, dtype=np.int64)  # file row of each private prompt
        self.id = f"prompts:{os.path.basename(path)}"

    # ---- users -------------------------------------------------------------------------------
    def user_rows(self, users) -> list[dict]:
        """The private rows of these user ids (each id names one private prompt, never reused)."""
        users = [int(u) for u in users]
        if any(not 0 <= u < self.population for u in users):
            raise PrivacyError(f"user id outside the private population of {self.population} prompts; lower "
                               f"rounds * users_per_round or add prompts")
        return [self.private[self.order[u]] for u in users]

    def member_ids(self, users) -> list[int]:
        """Population members of user ids: the file row of each user's prompt (independent of the seed), so a
        policy's provenance names the same prompts in any run on this file (``dppo.training.provenance``)."""
        users = np.asarray([int(u) for u in users], dtype=np.int64)
        users = users[(users >= 0) & (users < self.population)]
        return self.private_rows[self.order[users]].tolist()

    def users_of_members(self, members) -> list[int]:
        """The user ids whose prompts are these file rows (the inverse of ``member_ids``)."""
        pos = np.empty(self.population, dtype=np.int64)
        pos[self.order] = np.arange(self.population)      # user id of each private position
        wanted = np.isin(self.private_rows, np.asarray([int(m) for m in members], dtype=np.int64))
        return sorted(pos[np.flatnonzero(wanted)].tolist())

    def eval_rows(self, n: int | None = None) -> list[dict]:
        """The first ``n`` (default ``eval_size``) held-out public rows."""
        return self.public[: self.eval_size if n is None else min(int(n), len(self.public))]

    def prompts(self, rows: list[dict]) -> list[str]:
        return [r[self.prompt_key] for r in rows]

    # ---- reward ------------------------------------------------------------------------------
    def rewards(self, rows: list[dict], completions: list[str], group_size: int,
                reward_bound: float | None) -> tuple[np.ndarray, int]:
        """Rewards of ``group_size`` completions per row (row-major: row i's group is contiguous), clipped.

        Returns (rewards of shape (rows, group_size), number clipped). Raises ``DataError`` on a result of
        the wrong length, a non-number or NaN/inf (nothing of the round is released then).
        """
        n = len(rows) * group_size
        if len(completions) != n:
            raise DataError(f"internal: {len(completions)} completions for {n} (rows x group size)")
        reps = [r for r in rows for _ in range(group_size)]
        cols = {c: [r.get(c) for r in reps] for c in self.columns}
        try:
            out = self.reward_fn(prompts=self.prompts(reps), completions=list(completions), **cols)
        except Exception as err:  # noqa: BLE001 - the user's reward failing aborts the round
            raise DataError(f"the reward {self.reward_name} raised {type(err).__name__}: {err}; "
                            f"the round is not released") from None
        try:
            values = np.asarray(list(out), dtype=np.float64)
        except (TypeError, ValueError):
            raise DataError(f"the reward {self.reward_name} must return a list of floats") from None
        if values.shape != (n,):
            raise DataError(f"the reward {self.reward_name} returned {values.size} values for {n} completions; "
                            f"it must return one float per completion")
        if not np.all(np.isfinite(values)):
            raise DataError(f"the reward {self.reward_name} returned NaN/inf; the round is not released")
        clipped = 0
        if reward_bound is not None:
            c = np.clip(values, -reward_bound, reward_bound)
            clipped, values = int(np.count_nonzero(c != values)), c
        return values.reshape(len(rows), group_size), clipped

    def check_capacity(self, rounds: int, users_per_round: int) -> None:
        need = rounds * users_per_round
        if need > self.population:
            raise ConfigError(f"one-pass training needs {need} prompts ({rounds} rounds x {users_per_round}) but "
                              f"{self.path} has {self.population} private prompts; lower rounds/users_per_round")

    def __repr__(self) -> str:
        return (f"PromptsEnv({self.path!r}, public={len(self.public)}, private={self.population}, "
                f"reward={self.reward_name!r})")


