"""Reading the nodes of a captured graph for rotary's patterns (patterns.py): tensors and their sizes (static or
symbolic, compared without adding a guard), call arguments by position or name, slices of the last dim (prefix,
suffix, strided), and upcasts to float32 of a dtype float32 holds exactly."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ...graph.regions import cast_target, is_call, val

_EXACT_TO_FP32 = (torch.bfloat16, torch.float16, torch.float32)  # upcast to float32 without rounding


# ---- reading nodes -------------------------------------------------------------------------------

def _tensor(node):
    v = val(node)
    return v if isinstance(v, torch.Tensor) else None


def _static(s) -> int | None:
    """s when it is a plain int, or a SymInt whose expression is a constant (Dynamo's views of a dynamic input can
    carry one); else None (no int() on a symbolic size: that would specialize the captured shape)."""
    if isinstance(s, bool):
        return None
    if isinstance(s, int):
        return s
    if isinstance(s, torch.SymInt):
        v = s.node.maybe_as_int()
        return v if isinstance(v, int) else None
    return None


def _same_size(a, b) -> bool:
    """Whether two sizes Dynamo recorded are one: equal ints, or one symbolic expression (no guard added)."""
    if _static(a) is not None or _static(b) is not None:
        return _static(a) == _static(b)
    na, nb = getattr(a, "node", None), getattr(b, "node", None)
    return na is not None and nb is not None and str(getattr(na, "expr", na)) == str(getattr(nb, "expr", nb))


def _same_shape(a, b) -> bool:
    return a.dim() == b.dim() and all(_same_size(x, y) for x, y in zip(a.shape, b.shape))


def _last(node) -> int | None:
    """The static last dim of node's tensor."""
    v = _tensor(node)
    return _static(v.shape[-1]) if v is not None and v.dim() >= 1 else None


def _arg(node: fx.Node, i: int, name: str, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _is_last_dim(d, rank: int) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and d in (-1, rank - 1)


def _binary(node, name: str):
    """(a, b) when node is the plain binary `name` (mul, add, sub) of two nodes: no alpha, no out; else None."""
    if not is_call(node, name) or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    return (a, b) if isinstance(a, fx.Node) and isinstance(b, fx.Node) else None


def _slice_of(node):
    """(src, start, stop, step) when node is src[..., start:stop:step] - one slice of the last dim, spelled with
    an Ellipsis or with a full slice for every other dim (GPT-J's `x[:, :, :, ::2]`) - else None."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem):
        return None
    src, idx = node.args[0], node.args[1]
    sv = _tensor(src)
    if not (isinstance(src, fx.Node) and sv is not None and isinstance(idx, tuple) and idx
            and isinstance(idx[-1], slice)):
        return None
    full = slice(None, None, None)
    if not ((len(idx) == 2 and idx[0] is Ellipsis) or (len(idx) == sv.dim() and all(i == full for i in idx[:-1]))):
        return None
    sl = idx[-1]
    if not all(v is None or _static(v) is not None for v in (sl.start, sl.stop, sl.step)):
        return None
    return src, *(None if v is None else _static(v) for v in (sl.start, sl.stop, sl.step))


def _prefix(node, src=None):
    """(src, n) when node is src[..., :n] (start None or 0, step None or 1, n a non-negative int)."""
    s = _slice_of(node)
    if s is None or (src is not None and s[0] is not src):
        return None
    x, start, stop, step = s
    if start not in (None, 0) or step not in (None, 1) or stop is None or stop < 0:
        return None
    return x, stop


def _suffix(node, src=None):
    """(src, n) when node is src[..., n:] (n a non-negative int, step None or 1)."""
    s = _slice_of(node)
    if s is None or (src is not None and s[0] is not src):
        return None
    x, start, stop, step = s
    if start is None or start < 0 or stop is not None or step not in (None, 1):
        return None
    return x, start


def _strided(node, first: int):
    """src when node is src[..., first::2] (first 0 or 1; 0 also spelled None), else None."""
    s = _slice_of(node)
    if s is None:
        return None
    src, start, stop, step = s
    if step != 2 or stop is not None or (start if start is not None else 0) != first:
        return None
    return src


def _upcast_of(node):
    """x when node casts x (bf16, fp16 or fp32: exactly) to float32, else None."""
    if cast_target(node) != torch.float32 or not isinstance(node.args[0], fx.Node):
        return None
    xv = _tensor(node.args[0])
    return node.args[0] if xv is not None and xv.dtype in _EXACT_TO_FP32 else None
