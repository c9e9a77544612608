"""Activation and error capture: one forward with the layers' inputs and outputs recorded, one backward to
the recorded outputs only.

Rows do not interact in the forward pass (no batch statistics), so the error backpropagated to a layer's
output in row r of the summed objective L = sum_u L_u equals the one of L_u alone: a layer's captured inputs
and errors, grouped by user, hold every user's gradient of that layer (``dppo.policies.per_user_grads.rules``).
The backward (``torch.autograd.grad`` to the layer outputs) skips every parameter-gradient product of an
ordinary backward. A layer may see k rows per row of the objective (a prompt's KV cache repeated for its G
completions): its rows are then grouped k at a time, slot-major (``per_slot``). A module input or output
modified in place after the forward is detected (``Unsupported``).

One forward hook per parameter-owning module, registered the first time a policy's per-user gradients are
computed and kept (registering and removing hooks on every call cost about as much as a small layer's
gradient). The hook records only while a capture of that module is in progress, so outside ``capture``
(sampling, evaluation) it returns at once; it is a plain module-level function, so a copied or pickled policy
carries nothing that refers back to a capture.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import torch

from dppo.policies.per_user_grads.layout import Unsupported


class Record(NamedTuple):
    """One call of a hooked module: its inputs, its output and their versions at the time of the call."""

    module: torch.nn.Module
    args: tuple
    kwargs: dict
    output: torch.Tensor
    arg_versions: list
    output_version: int


class _Captures(threading.local):
    """The captures in progress in this thread: a stack of (modules to record, their records)."""

    def __init__(self):
        self.stack: list = []


_CAPTURES = _Captures()


def _capture_hook(module, args, kwargs, output):
    stack = _CAPTURES.stack
    if stack:
        modules, records = stack[-1]
        if module in modules:
            if not isinstance(output, torch.Tensor):
                raise Unsupported(f"{type(module).__name__} returns {type(output).__name__}, not a tensor")
            records.append(Record(module, args, kwargs, output,
                                  [a._version if isinstance(a, torch.Tensor) else None for a in args], output._version))


def ensure_hooks(modules) -> None:
    """Register the capture hook on each module that does not carry it yet (a deep copy of a policy carries
    it already: its modules are not registered twice)."""
    for mod in modules:
        if not any(h is _capture_hook for h in mod._forward_hooks.values()):
            mod.register_forward_hook(_capture_hook, with_kwargs=True)


def capture(module, objective, hooked, inputs: tuple, weights, slots: int) -> tuple[list, dict]:
    """One forward of ``objective(*inputs)`` (``module(*inputs)`` when None) recording the calls of the
    ``hooked`` modules, one backward of ``sum_r weights_r value_r`` to their outputs.

    Returns:
        ``(records, errors)``: the ``Record`` of every call, in call order, with inputs given as ``slots``
        rows (``per_slot``), and ``{id(output): dL/d output}`` (as ``slots`` rows; None where the output
        does not reach the objective).

    Raises:
        Unsupported: a captured input or output was modified in place after the call, or a layer was
            called on a number of rows that is not a multiple of ``slots``.
    """
    records: list = []
    _CAPTURES.stack.append((hooked, records))
    try:
        with torch.enable_grad():
            values = module(*inputs) if objective is None else objective(*inputs)
    finally:
        _CAPTURES.stack.pop()
    for mod, args, _, out, versions, out_version in records:
        if out._version != out_version or any(v is not None and a._version != v for a, v in zip(args, versions)):
            raise Unsupported(f"{type(mod).__name__}: a captured tensor was modified in place")
    needed = [rec.output for rec in records if rec.output.requires_grad]
    # errors at the layer outputs only: the autograd engine skips every parameter-gradient product
    errs = torch.autograd.grad((values * weights).sum(), needed, allow_unused=True) if needed else []
    err_of = dict(zip([id(o) for o in needed], errs))
    if any(rec.output.shape[0] != slots for rec in records):  # a layer called on k rows per slot
        records, err_of = _records_per_slot(records, err_of, slots)
    return records, err_of


def _records_per_slot(records: list, err_of: dict, slots: int) -> tuple[list, dict]:
    """The captures of layers called on k rows per slot, with inputs and errors as ``slots`` rows (``per_slot``)."""
    out_records, out_err = [], dict(err_of)
    for mod, args, kwargs, out, versions, out_version in records:
        R = out.shape[0]
        if R != slots:
            args = tuple(per_slot(a, slots) if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == R else a
                         for a in args)
            if out_err.get(id(out)) is not None:
                out_err[id(out)] = per_slot(out_err[id(out)], slots)
        out_records.append(Record(mod, args, kwargs, out, versions, out_version))
    return out_records, out_err


def per_slot(t: torch.Tensor, slots: int) -> torch.Tensor:
    """A layer's input or error with ``k * slots`` leading rows, slot-major (e.g. the G completions of
    each user's row after a prompt's KV cache was repeated for them), as ``slots`` rows of k times
    the inner positions; unchanged when it has ``slots`` rows."""
    if t.dim() == 0 or t.shape[0] == slots:
        return t
    if slots == 0 or t.shape[0] % slots:
        raise Unsupported(f"a layer was called on {t.shape[0]} rows, not a multiple of the {slots} slots")
    k = t.shape[0] // slots
    if t.dim() == 1:
        return t.reshape(slots, k)
    return t.reshape(slots, k * t.shape[1], *t.shape[2:])
