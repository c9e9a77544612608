"""``env=prompts``: a finite population of users, one prompt per user, and a programmatic reward.

Prompts come from a file (``env.path``, JSONL or gzip-compressed JSONL) or, from the Python API, from a
``datasets.Dataset`` or any list of dicts (``dppo.train(cfg, train_dataset=..., eval_dataset=...)``, TRL's
names). Each row has the prompt under ``prompt_key`` - a string, or a conversation (a list of
``{"role": ..., "content": ...}`` messages, rendered by the tokenizer's chat template as TRL does) - and
any extra columns, which are passed to the reward. Rows are split into a *public* part (evaluation and
supervised fine-tuning; anything may be logged about them) and a *private* part (the users of RL): by the
``split`` column (values ``public`` / ``private``) when every row has one; else, with separate evaluation
prompts (``eval_dataset`` from Python, ``env.eval_path``: a file), the training rows are all private and the
evaluation rows public; else, when ``public_size`` is set, the first ``public_size`` rows of a seeded shuffle
are public; else **every row is private** (a row is never public unless the user says so) and the run has no
held-out evaluation (no ``eval/return``, ``final_return`` null), which the builder says in one line on the
console (``split_note``, with the number of rows: a console line only, never written to a run's files).
Evaluation (``eval/return``, logged completions) uses public rows only.

Users: user id u (u = 0, 1, ... from the one-pass sampler) is private row ``order[u]`` of a seeded
permutation; an id past the private population is refused (``PrivacyError``), so no prompt is ever used
twice and evaluation never touches a private row. This is a one-step ("bandit-like") environment: the
context is the prompt, the action is a whole completion.

Rewards (TRL's ``reward_funcs`` / ``reward_weights``): one callable (``env.reward``) or a list
(``env.reward_funcs``), each a dotted path (``my_module.my_reward``), a ``{_target_: ..., _partial_: true,
**kwargs}`` spec (Hydra's partial: keyword arguments bound) or, from Python, the callable itself; each is called with TRL's convention ``f(prompts=[...], completions=[...],
**columns) -> list[float]`` (columns as lists aligned with the completions; for conversational prompts the
prompts are message lists and each completion is ``[{"role": "assistant", "content": text}]``, as in TRL).
The reward is the weighted sum ``sum_k w_k f_k`` (weights ``env.reward_weights``, default 1 each), then
clipped to ``[-reward_bound, reward_bound]`` before anything else sees it: the clipped sum is what enters
the per-user sensitivity, whatever the functions return. A target that cannot be imported is a
``ConfigError``; a wrong-length, non-numeric or NaN/inf result is a ``DataError`` raised before anything of
the round is released (both: one line, exit 2).

Nothing about the rows goes into the run's config: for rows from Python, ``env.path`` is ``<python rows>``.
The env hands out the rows' canonical bytes (``data_parts``: every row in order; ``member_content``: a
private prompt) and the trainer keys them with the run's secret (``dppo/training/secret.py``): a resumed or
reloaded run handed other rows is refused (user ids would name other prompts), and a consumed member is
identified by its prompt's content, whatever file, object, name or order it arrives in
(``dppo/training/provenance.py``); both digests live only in the run's secret files.
"""
from __future__ import annotations

import functools
import gzip
import json
import os
from collections.abc import Mapping
import time
from dataclasses import dataclass

import numpy as np
import torch

from dppo.data.streams import public_generator, public_reset_seeds, user_generator
from dppo.errors import ConfigError, DataError, PrivacyError


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_ROWS = "<python rows>"   # env.path of a run whose rows came from the API (train_dataset)


def resolve_file(path: str) -> str:
    """``path`` as given (absolute or relative to the working directory), else relative to the repository
    root (so the shipped ``assets/`` work from any directory)."""
    if path and not os.path.isfile(path) and not os.path.isabs(path):
        cand = os.path.join(REPO_ROOT, path)
        if os.path.isfile(cand):
            return cand
    return path


def load_rows(path: str, key: str = "env.path") -> list[dict]:
    """Rows of a JSONL file (``.gz``: gzip); one line error (naming the config ``key``) on a missing file or a
    bad line."""
    path = resolve_file(path)
    if not path or not os.path.isfile(path):
        raise ConfigError(f"{key}={path} is not a file; give a JSONL file of prompts (one JSON object a line)")
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


def dataset_rows(data, name: str) -> list[dict]:
    """The rows of a ``datasets.Dataset`` (its ``to_list()``; ``datasets`` itself is not imported) or of any
    iterable of mappings (e.g. a list of dicts) as plain dicts."""
    if isinstance(data, (str, bytes)) or isinstance(data, Mapping):
        raise ConfigError(f"{name} must be a datasets.Dataset or a list of dicts (one per prompt), got "
                          f"{type(data).__name__}")
    try:
        to_list = getattr(data, "to_list", None)
        rows = [dict(r) for r in (to_list() if callable(to_list) else data)]
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a datasets.Dataset or a list of dicts (one per prompt)") from None
    return rows


def is_rows(obj) -> bool:
    """Whether ``obj`` is a dataset of prompts rather than a config: a ``datasets.Dataset`` (duck-typed: rows
    by ``to_list()`` and ``column_names``) or a non-empty list / tuple of mappings (``{"prompt": ...}`` rows)."""
    if callable(getattr(obj, "to_list", None)) and hasattr(obj, "column_names"):
        return True
    return isinstance(obj, (list, tuple)) and len(obj) > 0 and all(isinstance(r, Mapping) for r in obj)


def canonical(value) -> bytes:
    """A JSON value as canonical bytes (mapping keys sorted, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


def is_conversation(prompt) -> bool:
    """A prompt in TRL's conversational format: a list of ``{"role", "content"}`` messages."""
    return (isinstance(prompt, (list, tuple)) and len(prompt) > 0
            and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt))


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


def callable_name(fn) -> str:
    """A callable's dotted name (``module.qualname``; a partial: its function's), as recorded in the config."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    module = getattr(inner, "__module__", None) or ""
    name = getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(inner).__name__
    return f"{module}.{name}" if module else name


def resolve_reward(spec):
    """The reward callable named by a dotted path or a ``{_target_: path, **kwargs}`` mapping (a callable as is)."""
    if callable(spec) and not isinstance(spec, Mapping):
        return spec
    kwargs = {}
    if isinstance(spec, Mapping):
        spec = dict(spec)
        target = spec.pop("_target_", None)
        spec.pop("_partial_", None)
        kwargs = spec
    else:
        target = spec
    if not isinstance(target, str) or not target:
        raise ConfigError("env.reward must name a callable, e.g. env.reward=my_module.my_reward")
    try:
        fn = locate(target)
    except Exception:  # noqa: BLE001 - import errors of any kind are the user's config
        raise ConfigError(f"env.reward '{target}' cannot be imported; give a dotted path module.function "
                          f"importable from the working directory, or pass the callable from Python "
                          f"(reward_funcs=[fn] to dppo.train / dppo.load)") from None
    if not callable(fn):
        raise ConfigError(f"env.reward '{target}' is not callable")
    return functools.partial(fn, **kwargs) if kwargs else fn


def reward_name(spec) -> str:
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Mapping):
        return str(spec.get("_target_"))
    return callable_name(spec)


class PromptsEnv:
    """Prompts as users; the rewards and the public / private split (module docstring).

    Args:
        path: JSONL (or ``.jsonl.gz``) file of prompts (or null when ``dataset`` is given).
        reward: one reward: a dotted path, a ``{_target_: ..., **kwargs}`` spec, or a callable.
        reward_funcs: several rewards (TRL's ``reward_funcs``), each as ``reward``; replaces ``reward``.
        reward_weights: one weight per reward function (TRL's ``reward_weights``; default 1 each).
        dataset: the prompts as a ``datasets.Dataset`` or a list of dicts (TRL's ``train_dataset``; Python only).
        eval_dataset: public evaluation prompts (TRL's ``eval_dataset``); ``dataset`` is then all private.
        eval_path: a JSONL file of public evaluation prompts (the file form of ``eval_dataset``); the rows of
            ``path`` are then all private.
        prompt_key: column holding the prompt (text, or a list of chat messages).
        split_key: column holding ``public`` / ``private`` (used when present in every row).
        public_size: without a split column or evaluation prompts, the number of rows (after a seeded
            shuffle) that are public; null: none (every row is private, no held-out evaluation).
        eval_size: held-out public prompts of the final greedy evaluation (``final_greedy_return``) and of
            the logged completions (the first ``eval_size`` public rows).
        eval_samples: sampled completions per evaluation prompt (the mean reward over all of them).
        show_completions: public prompts whose completions are logged as TensorBoard text.
        show_every: rounds between those text logs (0: never).
        seed: seed of the private order and of the shuffle.
    """

    kind = "prompts"
    horizon = 1
    observation_space = None
    action_space = None

    def __init__(self, path: str | None = None, reward=None, *, reward_funcs=None, reward_weights=None,
                 dataset=None, eval_dataset=None, eval_path: str | None = None, prompt_key: str = "prompt",
                 split_key: str = "split", public_size: int | None = None, eval_size: int = 256,
                 eval_samples: int = 4, show_completions: int = 4, show_every: int = 10, seed: int = 0):
        for key, value in (("eval_size", eval_size), ("show_completions", show_completions),
                           ("show_every", show_every)):   # counts: a negative one would slice rows from the end
            if int(value) < 0:
                raise ConfigError(f"env.{key} must be >= 0, got {value}")
        self.prompt_key, self.seed = prompt_key, int(seed)
        self.split_note = None   # a console line about the split (``read``), printed by the builder
        public, private, self.path = self.read(path, dataset, eval_dataset, split_key, public_size, eval_path)
        self.source_rows = "the rows passed in (train_dataset / eval_dataset)" if dataset is not None else self.path
        self.set_rewards(reward, reward_funcs, reward_weights)
        rows = public + private
        self.conversational = bool(rows) and is_conversation(rows[0].get(prompt_key))
        bad = [i for i, r in enumerate(rows)
               if not (is_conversation(r.get(prompt_key)) if self.conversational else isinstance(r.get(prompt_key), str))]
        if bad:
            kind = "a list of chat messages" if self.conversational else "a string"
            raise ConfigError(f"every row of {self.path} needs column '{prompt_key}' (env.prompt_key) holding {kind} "
                              f"(as the first row does); row {bad[0]} does not")
        self.columns = sorted({k for r in rows for k in r} - {prompt_key, split_key})
        self.public, self.private = public, private
        self.population = len(private)
        self.eval_size = min(int(eval_size), len(public))
        self.show_every = int(show_every)
        if eval_samples < 1:
            raise ConfigError(f"env.eval_samples must be >= 1, got {eval_samples}")
        self.eval_samples = int(eval_samples)
        self.show_completions = min(int(show_completions), self.eval_size)
        self.order = np.random.default_rng([self.seed, 11]).permutation(self.population)
        self.id = f"prompts:{os.path.basename(self.path)}"

    @property
    def evaluates(self) -> bool:
        """Whether there are held-out public prompts to evaluate on (else no ``eval/return``, ``final_return``)."""
        return bool(self.public)

    # ---- rows ----------------------------------------------------------------------------------
    def read(self, path, dataset, eval_dataset, split_key, public_size, eval_path=None):
        """(public rows, private rows, source name) by the split rules of the module docstring."""
        if dataset is not None:
            rows, source = dataset_rows(dataset, "train_dataset"), PYTHON_ROWS
        elif eval_dataset is not None:
            raise ConfigError("eval_dataset needs a train_dataset (the private prompts) beside it")
        else:
            if not path:
                raise ConfigError("env.path is not set: give a JSONL file of prompts (env.path=...) or, from "
                                  "Python, dppo.train(cfg, train_dataset=...)")
            if path == PYTHON_ROWS:
                raise ConfigError("this run's prompts were passed from Python (train_dataset); pass them again, "
                                  "e.g. dppo.train(cfg, run_dir, resume=True, train_dataset=..., reward_funcs=...) "
                                  "or dppo.load(run_dir, train_dataset=..., reward_funcs=...)")
            rows, source = load_rows(path), path
        if not rows:
            raise ConfigError(f"{source} has no rows")
        train_name = "train_dataset" if dataset is not None else f"env.path={source}"
        if eval_dataset is not None and eval_path:
            raise ConfigError(f"both eval_dataset and env.eval_path={eval_path} name the evaluation prompts; give one")
        evals = "eval_dataset" if eval_dataset is not None else ("env.eval_path" if eval_path else None)
        if evals:
            if any(split_key in r for r in rows):
                raise ConfigError(f"{train_name} has a '{split_key}' column and {evals} was given; use one way to "
                                  f"name the public prompts")
            public = (dataset_rows(eval_dataset, "eval_dataset") if eval_dataset is not None
                      else load_rows(eval_path, "env.eval_path"))
            marked = [i for i, r in enumerate(public) if r.get(split_key, "public") != "public"]
            if marked:
                raise ConfigError(f"{evals} row {marked[0]} has {split_key}={public[marked[0]][split_key]!r}; the "
                                  f"evaluation prompts are public (scored, logged, shown): remove that row")
            private = rows
        elif all(split_key in r for r in rows):
            bad = {r[split_key] for r in rows} - {"public", "private"}
            if bad:
                raise ConfigError(f"column '{split_key}' must be 'public' or 'private', found {sorted(bad)[:3]}")
            public = [r for r in rows if r[split_key] == "public"]
            private = [r for r in rows if r[split_key] == "private"]
        elif public_size is not None:
            if not 0 <= public_size <= len(rows):
                raise ConfigError(f"env.public_size={public_size} is not in 0..{len(rows)} (the rows of {source})")
            perm = np.random.default_rng([self.seed, 7]).permutation(len(rows))
            public = [rows[i] for i in perm[:public_size]]
            private = [rows[i] for i in perm[public_size:]]
        else:
            partial = next((i for i, r in enumerate(rows) if split_key not in r), None)
            if partial is not None and any(split_key in r for r in rows):
                raise ConfigError(f"column '{split_key}' is set on some rows of {source} and not on row {partial}: "
                                  f"set it (public / private) on every row, or on none")
            # nobody said a row is public: every row is a private user, and nothing is held out to evaluate on
            public, private = [], rows
            given = "eval_dataset" if dataset is not None else "env.eval_path"
            self.split_note = (f"no '{split_key}' column and no {given}: all {len(rows)} rows of {source} are private "
                               f"users; no held-out evaluation (give {given}=<public prompts> to evaluate)")
        if not private:
            raise ConfigError(f"{source} has no private prompts (split=private): RL has no users")
        return public, private, source

    # ---- rewards -------------------------------------------------------------------------------
    def set_rewards(self, reward, reward_funcs, reward_weights) -> None:
        if reward_funcs is not None:
            specs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        elif reward is not None:
            specs = [reward]
        else:
            specs = []
        if not specs:
            raise ConfigError("no reward: set env.reward=module.function (or env.reward_funcs=[...]), or pass "
                              "dppo.train(cfg, reward_funcs=[fn])")
        self.reward_fns = [resolve_reward(s) for s in specs]
        self.reward_names = [reward_name(s) for s in specs]
        weights = [1.0] * len(specs) if reward_weights is None else [float(w) for w in reward_weights]
        if len(weights) != len(specs) or not all(np.isfinite(weights)):
            raise ConfigError(f"env.reward_weights needs one finite weight per reward function ({len(specs)}), "
                              f"got {list(reward_weights)}")
        self.reward_weights = weights
        self.reward_name = " + ".join(n if w == 1 else f"{w:g} * {n}" for n, w in zip(self.reward_names, weights))

    def call_reward(self, k: int, prompts: list, completions: list, columns: dict) -> np.ndarray:
        """Reward function k on aligned lists; ``DataError`` (nothing released) on any bad result."""
        name = self.reward_names[k]
        try:
            out = self.reward_fns[k](prompts=prompts, completions=completions, **columns)
        except Exception as err:  # noqa: BLE001 - the user's reward failing aborts the round
            raise DataError(f"the reward {name} raised {type(err).__name__}: {err}; the round is not released") from None
        try:
            values = np.asarray(list(out), dtype=np.float64)
        except (TypeError, ValueError):
            raise DataError(f"the reward {name} must return a list of floats") from None
        if values.shape != (len(completions),):
            raise DataError(f"the reward {name} returned {values.size} values for {len(completions)} completions; "
                            f"it must return one float per completion")
        if not np.all(np.isfinite(values)):
            raise DataError(f"the reward {name} returned NaN/inf; the round is not released")
        return values

    def combined_reward(self, prompts: list, completions: list, **columns) -> np.ndarray:
        """sum_k w_k f_k(prompts, completions, **columns), unclipped (TRL's ``sum`` aggregation). Completions are
        text; for conversational prompts each function gets them as ``[{"role": "assistant", "content": text}]``."""
        if self.conversational and completions and isinstance(completions[0], str):
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        total = np.zeros(len(completions))
        for k, w in enumerate(self.reward_weights):
            total += w * self.call_reward(k, list(prompts), list(completions), columns)
        return total

    # ---- users -------------------------------------------------------------------------------
    def user_rows(self, users) -> list[dict]:
        """The private rows of these user ids (each id names one private prompt, never reused)."""
        users = [int(u) for u in users]
        if any(not 0 <= u < self.population for u in users):
            raise PrivacyError(f"user id outside the private population of {self.population} prompts; lower "
                               f"rounds * users_per_round or add prompts")
        return [self.private[self.order[u]] for u in users]

    def data_parts(self) -> list[bytes]:
        """Every row (public, then private, in the order user ids name them: the seed's permutation applied)
        as canonical bytes: the rows a run's user ids and evaluation refer to. Keyed by the run's secret
        (``dppo/training/secret.py``) this is the data check of a resume or a reload; never stored unkeyed."""
        return ([canonical(r) for r in self.public]
                + [canonical(self.private[int(i)]) for i in self.order])

    def member_content(self, users) -> list[bytes]:
        """The identity of these users' members (a private prompt): the prompt's canonical bytes (its text or
        chat messages), whatever its other columns, file, position or order; the trainer keys it with the run's
        secret (``dppo/training/provenance.py``), so the same person's prompt is recognized in any later run."""
        users = [int(u) for u in users]
        if any(not 0 <= u < self.population for u in users):
            raise PrivacyError(f"user id outside the private population of {self.population} prompts")
        return [canonical(self.private[self.order[u]][self.prompt_key]) for u in users]

    def eval_rows(self, n: int | None = None) -> list[dict]:
        """The first ``n`` (default ``eval_size``) held-out public rows."""
        return self.public[: self.eval_size if n is None else min(int(n), len(self.public))]

    def prompts(self, rows: list[dict]) -> list:
        """The prompts of these rows (strings, or chat-message lists that the policy renders with its chat template)."""
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
        values = self.combined_reward(self.prompts(reps), list(completions), **cols)
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

    def collector(self, seed: int) -> "PromptCollector":
        """What a policy-optimization learner collects from (``dppo.algos.core``)."""
        return PromptCollector(self, seed)

    def __repr__(self) -> str:
        return (f"PromptsEnv({self.path!r}, public={len(self.public)}, private={self.population}, "
                f"reward={self.reward_name!r})")


@dataclass
class Completions:
    """One round's completions, in the layout the learners share with episodes of a one-step env.

    ``prompt_ids/prompt_mask`` (U, P) left-padded prompts, one per user; ``ids/token_mask`` (U*G, T)
    completions, user-major (user i's G completions are rows i*G ..); ``rewards`` (U*G, 1) clipped rewards and
    ``mask`` (U*G, 1) the steps, as in ``Episodes``: one step per episode, the whole completion is the action.
    """

    rows: list
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    ids: torch.Tensor
    token_mask: torch.Tensor
    texts: list
    rewards: torch.Tensor
    group_size: int = 1
    clipped: int = 0
    seconds: float = 0.0

    @property
    def users(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def returns(self) -> torch.Tensor:
        return self.rewards[:, 0]

    @property
    def mask(self) -> torch.Tensor:
        return torch.ones(self.rewards.shape, dtype=torch.bool)

    @property
    def lengths(self) -> torch.Tensor:
        return torch.ones(self.rewards.shape[0], dtype=torch.long)

    @property
    def tokens(self) -> int:
        return int(self.token_mask.sum())

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        """Reshape a per-completion tensor (U*G, ...) to (users, G, ...)."""
        return x.reshape(self.users, self.group_size, *x.shape[1:])

    def metrics(self) -> dict:
        n = max(self.rewards.numel(), 1)
        return {"rollout/users": self.users, "rollout/episodes": self.users * self.group_size,
                "diag/return": float(self.returns.mean()), "diag/reward_clip_fraction": self.clipped / n,
                "diag/completion_tokens": self.tokens / n, "perf/tokens_per_s": self.tokens / max(self.seconds, 1e-9)}


class PromptCollector:
    """What a policy-optimization learner asks of ``env=prompts`` (the prompt-side twin of ``EpisodeCollector``).

    A round's users: user u (a private prompt) gets G completions sampled from u's own stream
    (``user_generator(run seed, u, round)``), scored by the env's reward and clipped as they arrive.
    Public completions (evaluation, a public Fisher matrix) use public prompts only: evaluation the first
    held-out public prompts with a fixed public stream (the same for every run and round), the Fisher's
    public prompts and sampling streams by round (``public_reset_seeds``). Nothing here reads a private
    prompt except ``users``.
    """

    def __init__(self, env: PromptsEnv, seed: int):
        self.env, self.seed = env, int(seed)

    def check(self, policy, rounds: int, sampler) -> None:
        """One pass over enough private prompts, each fitting the model's context with a completion."""
        from dppo.policies.check import check_lm_policy

        check_lm_policy(policy)
        if sampler.multi_pass:
            raise ConfigError("env=prompts supports one-pass training only (privacy.multi_pass=false)")
        self.env.check_capacity(int(rounds), int(sampler.users_per_round))
        ctx = policy.context
        if ctx is None:
            return
        room = ctx - policy.max_new_tokens
        for part, rows in (("public", self.env.public), ("private", self.env.private)):
            lengths = policy.prompt_lengths(self.env.prompts(rows)) if rows else []
            too_long = [i for i, n in enumerate(lengths) if n > room or n == 0]
            if too_long:
                raise ConfigError(f"{len(too_long)} {part} prompt(s) of {self.env.path} (first: {part} row "
                                  f"{too_long[0]}) are empty or longer than the model's context ({ctx} tokens) minus "
                                  f"policy.max_new_tokens ({policy.max_new_tokens})")

    def _batch(self, policy, rows, uniforms, group_size: int, reward_bound: float | None) -> Completions:
        pid, pmask = policy.encode(self.env.prompts(rows))
        t0 = time.perf_counter()
        comp = policy.sample(pid, pmask, uniforms, group=group_size)
        seconds = time.perf_counter() - t0
        rewards, clipped = self.env.rewards(rows, comp.texts, group_size, reward_bound)
        return Completions(rows, pid, pmask, comp.ids, comp.mask, comp.texts,
                           torch.as_tensor(rewards, dtype=torch.float64).reshape(-1, 1), group_size, clipped, seconds)

    def users(self, policy, users, round_idx: int, group_size: int, reward_bound: float | None,
              public: int = 0) -> tuple[Completions, Completions | None]:
        """G completions per user from the user's own stream, and ``public`` public prompts' completions."""
        rows, G, T = self.env.user_rows(users), int(group_size), policy.max_new_tokens
        u = torch.cat([torch.rand(G, T, generator=user_generator(self.seed, uid, round_idx), dtype=torch.float64)
                       for uid in users])
        return self._batch(policy, rows, u, G, reward_bound), (self.public(policy, "fisher", round_idx, public)
                                                               if public else None)

    def public(self, policy, stream: str, round_idx: int, n: int, greedy: bool = False) -> Completions:
        """One completion of each of ``n`` public prompts drawn by the public stream (never a private one)."""
        public = self.env.public
        if not public:
            raise ConfigError(f"{self.env.path} has no public prompts: public completions (a Fisher matrix) need some")
        rows = [public[s % len(public)] for s in public_reset_seeds(self.seed, stream, round_idx, n)]
        u = None if greedy else torch.rand(n, policy.max_new_tokens, generator=public_generator(self.seed, stream,
                                                                                                round_idx),
                                           dtype=torch.float64)
        return self._batch(policy, rows, u, 1, None)

    def completions(self, policy, rows: list[dict], greedy: bool, group: int = 1, stream: str = "eval"):
        """Completions of held-out public prompts from the fixed public ``stream`` (or greedy)."""
        pid, pmask = policy.encode(self.env.prompts(rows))
        u = None
        if not greedy:
            u = torch.rand(len(rows) * group, policy.max_new_tokens, generator=public_generator(0, stream, 0),
                           dtype=torch.float64)
        return policy.sample(pid, pmask, u, group=group)

    def evaluate(self, policy, episodes: int, greedy: bool = False, stream: str = "eval") -> float:
        """Mean reward (unclipped) on the first ``episodes`` held-out public prompts: ``env.eval_samples``
        completions each from a fixed public stream (the same for every run and round), or one greedy one.
        ``stream="select"`` (``eval.select=best``): the next ``episodes`` held-out prompts, their own stream."""
        rows = self.env.eval_rows(episodes)
        if stream != "eval":   # enough of them: checked at build (``dppo.build.run.check_selection``)
            rows = self.env.public[len(rows): 2 * len(rows)]
        if not rows:
            return float("nan")
        k = 1 if greedy else self.env.eval_samples
        rewards, _ = self.env.rewards(rows, self.completions(policy, rows, greedy, group=k, stream=stream).texts, k,
                                      None)
        return float(rewards.mean())

    def evaluate_episodes(self, policy, episodes: int, greedy: bool = False, stream: str = "eval"):
        """None: a prompt's score is a mean over its completions, not one episode's return."""
        return None

    def log_examples(self, policy, logger, round_idx: int) -> None:
        """Greedy completions of a few held-out public prompts as TensorBoard text (never private ones)."""
        env = self.env
        if logger is None or not env.show_every or round_idx % env.show_every:
            return
        rows = env.eval_rows(env.show_completions)
        if not rows:
            return
        comp = self.completions(policy, rows, greedy=True)
        rewards, _ = env.rewards(rows, comp.texts, 1, None)
        lines = ["|prompt|completion|reward|", "|-|-|-|"]
        lines += [f"|`{p}`|`{c}`|{float(r):.3f}|" for p, c, r in zip(env.prompts(rows), comp.texts, rewards[:, 0])]
        logger.text("eval/completions", "\n".join(lines), round_idx)

    @property
    def has_public(self) -> bool:
        return bool(self.env.public)

    def summary(self, policy) -> dict:
        greedy = None   # no held-out public prompts: nothing to evaluate on (never a private one)
        try:  # public prompts; a reward that fails here has already failed the run (DataError)
            if self.env.eval_size:
                greedy = self.evaluate(policy, self.env.eval_size, greedy=True)
        except DataError:
            greedy = None
        return {"trainable_parameters": policy.num_trainable(), "eval_samples": self.env.eval_samples,
                "final_greedy_return": greedy}


