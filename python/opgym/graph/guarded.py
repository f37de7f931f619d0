"""What replaces a region in a captured graph (opgym/graph/backend.py's rewrite): a guarded call of the op, or of the
region's own captured code, counted. A leaf of the graph package: backend.py and cuda_graphs.py both read it."""
from __future__ import annotations

import torch

from .. import ops as _ops_table
from ..guard import count, switch_on


class GuardedRegion:
    """What replaces a region in the graph: target(*inputs, *consts), or the region's captured code."""

    def __init__(self, op: str, target, consts: tuple, fallback, counters, check=None):
        self.op, self.target, self.consts, self.fallback, self.counters = op, target, consts, fallback, counters
        self.check = check  # (*inputs) -> why this call runs the captured code, or None (a pattern's per-call rule)
        self.switch = _ops_table.spec(op).switch
        self.__name__ = f"opgym_{op}"

    def __call__(self, *inputs):
        if not switch_on(self.switch):
            reason = f"{self.switch}=0"
        elif torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
            reason = f"gradient needed (opgym::{self.op} has no backward)"
        elif self.check is not None and (reason := self._checked(inputs)) is not None:
            pass
        else:
            try:
                if torch.is_grad_enabled():
                    out = self.target(*inputs, *self.consts)
                else:  # below autograd, as opgym.patch's guarded call (guard.py: it records nothing here, and
                    with torch._C._AutoDispatchBelowAutograd():  # the ops' Python Autograd kernels cost
                        out = self.target(*inputs, *self.consts)  # more than a decode row's kernel)
            except Exception as e:  # noqa: BLE001 - the model never raises because of opgym
                reason = f"opgym error: {type(e).__name__}"
            else:
                count(self.counters, True)
                return out
        count(self.counters, False, reason)
        return self.fallback(*inputs)

    def _checked(self, inputs):
        try:
            return self.check(*inputs)
        except Exception as e:  # noqa: BLE001 - the model never raises because of opgym
            return f"opgym error in the check: {type(e).__name__}"
