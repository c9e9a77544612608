"""A run's secret: a random key, and what it keys (``dppo/training/provenance.py``, ``Trainer.adopt_secret``).

Anything computed from private rows that a run must keep - a fingerprint of its data, so that a resume or
``dppo.load`` handed other rows is refused, and the identities of the members it consumed, so that a later
fine-tuning run skips them whatever file or order they come in, and the set of rows a statement
``policy.init_data_disjoint=true`` is about - is an HMAC-SHA256 under a key drawn from the OS CSPRNG when
the run starts. The key and the keyed digests live only in the run's secret files (its
checkpoints and its user journal), never in a shareable one (``summary.json``, ``policy.pt``, ``.hydra/``,
logs): without the key, a digest gives no dictionary test (an adversary who knows every row but one cannot
check a candidate for the last), and the key itself is independent of the data.
"""
from __future__ import annotations

import hashlib
import hmac
import os

KEY_BYTES = 32


def new_key() -> str:
    """A fresh run key (hex), from the OS CSPRNG (never seeded: it guards the digests, not the noise)."""
    return os.urandom(KEY_BYTES).hex()


def keyed_digest(key: str, content: bytes) -> str:
    """HMAC-SHA256 of ``content`` under ``key`` (hex)."""
    return hmac.new(bytes.fromhex(key), content, hashlib.sha256).hexdigest()


def data_fingerprint(key: str, parts) -> str:
    """A keyed fingerprint of a sequence of byte strings (in order): equal iff the same parts in the same order."""
    mac = hmac.new(bytes.fromhex(key), digestmod=hashlib.sha256)
    for p in parts:
        mac.update(len(p).to_bytes(8, "big"))
        mac.update(p)
    return mac.hexdigest()
