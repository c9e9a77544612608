"""Atomic checkpoints and summaries: write a temp file, fsync, rename; load never executes code."""
from __future__ import annotations

import glob
import json
import os
import random
import re

import numpy as np
import torch

from dppo.errors import ConfigError

CKPT_RE = re.compile(r"ckpt_(\d{6})\.pt$")


FAULT_ENV = "DPPO_FAULT_KILL_IN_CHECKPOINT"  # fault injection for tests: SIGKILL halfway through this file name


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        if os.environ.get(FAULT_ENV) and path.endswith(os.environ[FAULT_ENV]):
            f.write(data[: len(data) // 2])
            f.flush()
            os.kill(os.getpid(), 9)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: str, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=_jsonable) + "\n").encode())


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def atomic_torch_save(path: str, obj) -> None:
    """``torch.save(obj)`` to ``path`` atomically, streamed to the temp file: no copy of the serialized bytes in
    memory (a tabular learner's statistics can be a GB; a buffer and its copy would double the run's peak)."""
    if os.environ.get(FAULT_ENV) and path.endswith(os.environ[FAULT_ENV]):
        import io

        buf = io.BytesIO()                      # the fault injection writes half of the bytes, then dies
        torch.save(obj, buf)
        atomic_write_bytes(path, buf.getvalue())
        return
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(ckpt_dir: str, round_idx: int, state: dict, keep: int = 3) -> str:
    """Save ``state`` as ``ckpt_<round>.pt`` atomically and prune all but the newest ``keep``."""
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, f"ckpt_{round_idx:06d}.pt")
    atomic_torch_save(path, state)
    for old in list_checkpoints(ckpt_dir)[:-keep]:
        os.remove(old)
    return path


def list_checkpoints(ckpt_dir: str) -> list[str]:
    """Complete checkpoint files, oldest first (temp files of interrupted writes are ignored)."""
    files = [p for p in glob.glob(os.path.join(ckpt_dir, "ckpt_*.pt")) if CKPT_RE.search(p)]
    return sorted(files)


def load_latest_checkpoint(ckpt_dir: str) -> tuple[dict, str] | tuple[None, None]:
    """Newest checkpoint that loads; a corrupt or truncated one is skipped for the previous one.

    ``weights_only=True``: loading never unpickles arbitrary objects, so never executes code.
    """
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged file is skipped, the previous one is used
            continue
        if isinstance(state, dict) and state.get("format") == "dppo-ckpt-1":
            return state, path
    return None, None


def rng_state() -> dict:
    """Global RNG states (python, numpy, torch) in a weights_only-loadable form."""
    np_state = np.random.get_state()
    return {"python": _tuples_to_lists(random.getstate()),
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])


def _tuples_to_lists(x):
    if isinstance(x, tuple):
        return [_tuples_to_lists(v) for v in x]
    return x


# settings an older checkpoint's fingerprint holds that a resume may now change (how often it evaluates)
NO_LONGER_FINGERPRINTED = ("eval_every",)


def check_fingerprint(saved, current, extendable: dict | None = None) -> None:
    """Refuse a resume whose settings differ from the checkpoint's, in one line naming the first key.

    ``saved``/``current`` are the flattened settings (``dppo.build.fingerprint``); an older checkpoint's
    hash string is compared as a whole. ``extendable`` maps a key a resume may *raise* (``rounds``: extending
    a run) to the number of rounds done, or to the reason it may not change (the refusal's text).
    """
    if isinstance(saved, dict) and isinstance(current, dict):
        saved = {k: v for k, v in saved.items() if k not in NO_LONGER_FINGERPRINTED}
        keys = sorted((set(saved) | set(current)) - {"_hash"})
        # a key added to the schema later (absent from an older checkpoint) is unchanged if it is null now
        changed = [k for k in keys if saved.get(k) != current.get(k) or (k in saved) != (k in current)
                   and (saved.get(k, _MISSING) is not None and current.get(k, _MISSING) is not None)]
        for k, rule in (extendable or {}).items():
            if k not in changed:
                continue
            was, now = saved.get(k, _MISSING), current.get(k, _MISSING)
            if isinstance(rule, str):
                raise ConfigError(f"resume refused: '{k}' was {_show(was)} in the checkpoint, now {_show(now)}: {rule}")
            if isinstance(was, int) and isinstance(now, int) and now > was:
                changed.remove(k)   # more rounds of new users: allowed (the run is extended)
            elif isinstance(now, int) and now < was:
                raise ConfigError(f"resume refused: '{k}' was {was} in the checkpoint, now {now}; a resumed run can "
                                  f"only be extended (more {k}), not shortened")
        if changed:
            k = changed[0]
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise ConfigError(f"resume refused: '{k}' was {_show(saved.get(k, _MISSING))} in the checkpoint, now "
                              f"{_show(current.get(k, _MISSING))}{more}; a resumed run must keep every setting that "
                              f"affects privacy (different configuration; only logging, progress, checkpoint_every, "
                              f"eval and callbacks may change)")
        return
    saved_hash = saved.get("_hash") if isinstance(saved, dict) else saved
    current_hash = current.get("_hash") if isinstance(current, dict) else current
    if saved_hash != current_hash:
        raise ConfigError("the checkpoint was written by a run with a different configuration; resume with "
                          "the run's own config (only logging, progress, checkpoint_every and eval may change)")


_MISSING = "<unset>"


def _show(v) -> str:
    return "null" if v is None else str(v)
