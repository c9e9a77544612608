"""Provenance of the initial weights (``policy.init_from``): which users their training consumed, so that private
fine-tuning never reuses one of them."""
from __future__ import annotations

import os
import sys

import torch
from omegaconf import OmegaConf

from dppo.build.policy import torch_load_weights
from dppo.errors import ConfigError


def inherited_provenance(cfg, record: dict | None, population, init_state: dict | None = None) -> list[dict]:
    """What the weights of ``policy.init_from`` consumed (their provenance), plus the users
    ``policy.init_users_offset=<n>`` names (this run's ids 0..n-1). A bare state_dict has no provenance: it is
    refused unless the offset is stated (0 = the weights never saw a user of this population). A shareable
    ``policy.pt`` of a run on private rows withholds its members: they are read from that run's directory
    (``policy.init_provenance=<run_dir>``), or the user states ``policy.init_data_disjoint=true``
    (``withheld_rows``)."""
    from dppo.training import provenance

    init_from = OmegaConf.select(cfg, "policy.init_from", default=None)
    offset = OmegaConf.select(cfg, "policy.init_users_offset", default=None)
    source = OmegaConf.select(cfg, "policy.init_provenance", default=None)
    disjoint = OmegaConf.select(cfg, "policy.init_data_disjoint", default=None)
    if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool) or offset < 0):
        raise ConfigError(f"policy.init_users_offset must be an integer >= 0, got {offset}")
    if disjoint is not None and not isinstance(disjoint, bool):
        raise ConfigError(f"policy.init_data_disjoint must be true or false, got {disjoint}")
    for key, value in (("init_users_offset", offset), ("init_provenance", source), ("init_data_disjoint", disjoint)):
        if value not in (None, False) and not init_from:
            raise ConfigError(f"policy.{key} applies to policy.init_from (the users its weights consumed); "
                              f"set policy.init_from too, or drop policy.{key}")
    if not init_from:
        return []
    if record is None and offset is None:
        raise ConfigError(f"policy.init_from={init_from} is a bare state_dict: which users trained it is unknown; "
                          f"state policy.init_users_offset=<n> (its training used user ids 0..n-1 of this run's "
                          f"population; 0 if it never saw one of them), or init from a run directory or its policy.pt")
    if source:
        record = secret_provenance(source, init_from, init_state)
    if provenance.withheld(record):
        record = {**record, "consumed": withheld_rows(init_from, record["consumed"], population, disjoint)}
    out = list(record["consumed"]) if record is not None else []
    if offset:
        out.append(provenance.offset_entry(population, offset))
    return out


def withheld_rows(init_from: str, consumed: list[dict], population, disjoint) -> list[dict]:
    """The entries of private rows whose members no record at hand carries (a shared ``policy.pt``'s, or ones a run
    this source descends from stated disjoint from its own rows): they cannot be skipped, so they stay in this
    run's record - a later run from it, however deep the chain, must not reuse them either - and this run goes on
    only where its rows are stated disjoint from them: now (``policy.init_data_disjoint=true``), or by an earlier
    run on the very same rows. Otherwise one line."""
    from dppo.training import provenance

    if disjoint:
        print(f"dppo: note: policy.init_data_disjoint=true: no row of this run is skipped for the private rows "
              f"that trained policy.init_from={init_from} (stated disjoint; they stay in this run's record: a later "
              f"run from it on other rows is refused unless it states so too)", file=sys.stderr)
        return provenance.state_disjoint(consumed, population)
    unknown = [e for e in consumed if e.get("withheld") and not provenance.stated_disjoint(e, population)]
    if any(provenance.statements(e) for e in unknown):
        raise ConfigError(f"policy.init_from={init_from} descends from a run on private rows whose members no record "
                          f"carries (stated disjoint from other rows than this run's), so they cannot be skipped; "
                          f"train on the rows that statement was about, or state policy.init_data_disjoint=true "
                          f"if this run's data share no person with them")
    if unknown:
        raise ConfigError(f"policy.init_from={init_from} is a shared policy.pt of a run on private rows, which "
                          f"does not carry their members; name that run's directory with "
                          f"policy.init_provenance=<run_dir> (or init from the directory itself), or state "
                          f"policy.init_data_disjoint=true if this run's data share no person with its")
    return list(consumed)


def secret_provenance(source: str, init_from: str, init_state: dict | None) -> dict:
    """``policy.init_provenance``: the whole provenance record of the run that wrote ``policy.init_from``, read
    from its secret files (its newest checkpoint: a run directory or a checkpoint file), after checking
    that the checkpoint holds the very weights being loaded."""
    from dppo.training import provenance
    from dppo.training.checkpoint import load_latest_checkpoint

    path = str(source)
    state = None
    if os.path.isdir(path):
        state, _ = load_latest_checkpoint(os.path.join(path, "checkpoints"))
    elif os.path.isfile(path):
        state = torch_load_weights(path, path)
    if not (isinstance(state, dict) and isinstance(state.get("learner"), dict)
            and provenance.is_record(state.get("provenance"))):
        raise ConfigError(f"policy.init_provenance={path} is not a run directory (or checkpoint) with a readable "
                          f"checkpoint; name the directory of the run that wrote policy.init_from")
    if not _holds_the_weights(state["learner"].get("policy"), init_state):
        raise ConfigError(f"policy.init_provenance={path} is not the run that wrote policy.init_from={init_from} "
                          f"(its newest checkpoint holds other weights); name that run's own directory")
    return state["provenance"]


def _holds_the_weights(saved, init_state) -> bool:
    """Whether a checkpoint's policy tensors are the ones being loaded: every saved tensor (a checkpoint may hold
    only the trainable ones, e.g. an LM's adapter, under the wrapped module's names) equals its init tensor."""
    if not (isinstance(saved, dict) and saved and isinstance(init_state, dict)):
        return False
    for k, v in saved.items():
        mine = init_state.get(k, init_state.get(f"model.{k}"))
        if not (torch.is_tensor(v) and torch.is_tensor(mine) and v.shape == mine.shape and torch.equal(v, mine)):
            return False
    return True


def exclude_pretraining_users(sampler, population, consumed: list[dict]) -> None:
    """Private fine-tuning never reuses a user whose data trained the initial weights: their ids are skipped
    for ever (``dppo.training.provenance.exclude``)."""
    from dppo.training import provenance

    if sampler is not None and consumed:
        provenance.exclude(sampler, population, consumed, "policy.init_from")
