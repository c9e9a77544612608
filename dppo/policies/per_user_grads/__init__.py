"""The per-user-gradient engine: gradients of any per-row objective, grouped by user, from ONE backward pass.

User u's objective is L_u = sum_{r in u} w_r f(r) over its rows r (one privacy unit, contract C5), for any
per-row scalar f (a log-probability, a clipped surrogate plus a value loss, a KL penalty, ...). Rows do not
interact in the forward pass, so one forward with hooks on the parameter-owning modules and one backward to
the layers' outputs give every layer's inputs and errors, and grouped by user they hold every user's gradient
(the book-keeping / Opacus grad-sample idea, summed per user instead of per row). Two results are formed
from that one capture:

* ``per_user_gradients``: the (m, P) matrix of per-user gradients (the materialised path), and
  ``per_user_gradients_func``, the same by a ``torch.func`` vmap over users (the reference, and the fallback);
* ``clipped_gradient_sum``: sum_u c_u g_u and the norms ||g_u||, without the (m, P) matrix (the fused path).

One engine for every parameter space of ``dppo.policies.spaces``. The modules, by job (each imports only the
ones before it):

    layout.py        users' rows as slots, users in buckets of equal length (``Groups``)
    rules.py         per-layer rules (Linear, Embedding, LayerNorm, RMSNorm) and the torch.func fallbacks
    capture.py       the forward hooks; one forward and one backward to the layers' outputs (``capture``)
    plan.py          the trainable parameters, their columns and owning modules, cached per policy
    materialised.py  ``per_user_gradients``, ``per_user_gradients_func``
    fused.py         ``clipped_gradient_sum`` (falls back to ``per_user_gradients`` where it cannot fuse)
"""
from dppo.policies.per_user_grads.fused import NORM_METHODS, clipped_gradient_sum
from dppo.policies.per_user_grads.layout import PAD_MULTIPLE, BucketParts, Groups, Unsupported, pad_users
from dppo.policies.per_user_grads.materialised import METHODS, per_user_gradients, per_user_gradients_func
from dppo.policies.per_user_grads.rules import RULES, functional, register_rule

__all__ = ["METHODS", "NORM_METHODS", "PAD_MULTIPLE", "RULES", "BucketParts", "Groups", "Unsupported",
           "clipped_gradient_sum", "functional", "pad_users", "per_user_gradients", "per_user_gradients_func",
           "register_rule"]
