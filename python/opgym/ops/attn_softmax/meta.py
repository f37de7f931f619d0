"""opgym::attn_softmax's operators, Python half (their CPU kernels: attn_softmax.cpp, on torch's stable
ABI): schemas, fake kernels with the real kernels' checks, autograd rules (opgym/_meta.py), and the
torch build's CPU capability handed to the kernels (its softmax's lane order and exp)."""
from __future__ import annotations

import torch

from ... import _meta as m

_NO_GRAD = (" has no backward (an inference kernel); call it under torch.no_grad(), or use HF's own attention where "
            "gradients are needed")


def define() -> None:
    m.define("attn_windows(Tensor query, Tensor key, Tensor value, float scale, Tensor cu_seqlens) -> Tensor")
    m.define("attn_eager(Tensor query, Tensor key, Tensor value, float scale, Tensor? mask=None, int groups=1, "
             "bool grouped=False) -> (Tensor, Tensor)")
    m.define("attn_softmax(Tensor scores, float scale, Tensor? mask=None) -> Tensor")
    # The in-place forms return nothing: torch.compile functionalizes a custom op's mutation only then.
    m.define("attn_softmax_(Tensor(a!) scores, float scale, Tensor? mask=None) -> ()")
    m.define("attn_softmax_segments(Tensor scores, float scale, Tensor cu_seqlens, bool block_diagonal=False) -> Tensor")
    m.define("attn_softmax_segments_(Tensor(a!) scores, float scale, Tensor cu_seqlens, bool block_diagonal=False) -> ()")
    m.define("set_torch_cpu_capability(str capability) -> ()", ns="opgym_internal")


def check(scores, mask, op) -> None:
    m.check_tensor(scores, "scores", op)
    if not 1 <= scores.dim() <= 8:
        raise ValueError(f"opgym::{op}: scores must have rank 1 to 8, got {m.sizes(scores)}")
    if mask is None:
        return
    m.check_tensor(mask, "mask", op)
    m.check_device(mask, "mask", scores, "scores", op)
    if mask.dtype != scores.dtype:
        raise ValueError(f"opgym::{op}: mask must have scores' dtype {m.dtype_name(scores.dtype)} (HF adds it in that "
                         f"dtype; another would promote), got {m.dtype_name(mask.dtype)}")
    msg = f"opgym::{op}: mask must broadcast to scores {m.sizes(scores)}, got {m.sizes(mask)}"
    if mask.dim() > scores.dim():
        raise ValueError(msg)
    lead = scores.dim() - mask.dim()
    for d in range(mask.dim()):
        m.value_check((mask.shape[d] == 1) | (mask.shape[d] == scores.shape[lead + d])
                      if isinstance(mask.shape[d], torch.SymInt) else
                      mask.shape[d] == 1 or mask.shape[d] == scores.shape[lead + d], msg)


def check_segments(scores, cu, op) -> None:
    m.check_tensor(scores, "scores", op)
    if not 2 <= scores.dim() <= 8:
        raise ValueError(f"opgym::{op}: scores must be [..., P, W] (rank 2 to 8), got {m.sizes(scores)}")
    if cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"opgym::{op}: cu_seqlens must be a 1-D int32 or int64 tensor")


def _check_qkv(q, k, v, op) -> None:
    m.check_tensor(q, "query", op)
    m.check_tensor(k, "key", op)
    m.check_tensor(v, "value", op)
    m.check_device(k, "key", q, "query", op)
    m.check_device(v, "value", q, "query", op)


def _fake_windows(q, k, v, scale, cu):
    op = "attn_windows"
    _check_qkv(q, k, v, op)
    if not (q.dim() == 4 and k.dim() == 4 and v.dim() == 4):
        raise ValueError(f"opgym::attn_windows: query, key and value must be [1, H, P, D], got {m.sizes(q)}, "
                         f"{m.sizes(k)}, {m.sizes(v)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError("opgym::attn_windows: query, key and value must have one dtype")
    msg = (f"opgym::attn_windows: query, key and value must be [1, H, P, D] alike, got {m.sizes(q)}, {m.sizes(k)}, "
           f"{m.sizes(v)}")
    for a, b in ((q.shape[0], 1), (k.shape[0], 1), (v.shape[0], 1), (k.shape[1], q.shape[1]), (k.shape[2], q.shape[2]),
                 (k.shape[3], q.shape[3]), (v.shape[1], q.shape[1]), (v.shape[2], q.shape[2])):
        m.value_check(a == b, msg)
    if cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
        raise ValueError("opgym::attn_windows: cu_seqlens must be a 1-D int32 or int64 tensor")
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[3]))


def _fake_eager(q, k, v, scale, mask=None, groups=1, grouped=False):
    op = "attn_eager"
    _check_qkv(q, k, v, op)
    if not (q.dim() == 4 and k.dim() == 4 and v.dim() == 4):
        raise ValueError(f"opgym::attn_eager: query, key and value must be 4-D [B, heads, len, head_dim], got "
                         f"{m.sizes(q)}, {m.sizes(k)}, {m.sizes(v)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError("opgym::attn_eager: query, key and value must have one dtype")
    if groups < 1:
        raise ValueError(f"opgym::attn_eager: groups must be >= 1, got {groups}")
    msg = (f"opgym::attn_eager: query heads must be key heads x groups (and value heads key heads), got {m.sizes(q)}, "
           f"{m.sizes(k)}, {m.sizes(v)}, groups {groups}")
    m.value_check(q.shape[1] == k.shape[1] * groups, msg)
    m.value_check(v.shape[1] == k.shape[1], msg)
    weights = q.new_empty((q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    check(weights, mask, op)
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[3])), weights


def _fake_softmax(scores, scale, mask=None):
    check(scores, mask, "attn_softmax")
    return scores.new_empty(scores.shape)


def _fake_softmax_(scores, scale, mask=None):
    check(scores, mask, "attn_softmax_")


def _fake_segments(scores, scale, cu, block_diagonal=False):
    check_segments(scores, cu, "attn_softmax_segments")
    return scores.new_empty(scores.shape)


def _fake_segments_(scores, scale, cu, block_diagonal=False):
    check_segments(scores, cu, "attn_softmax_segments_")


def register() -> None:
    lib = m.library("opgym")
    for name, fake in (("attn_windows", _fake_windows), ("attn_eager", _fake_eager), ("attn_softmax", _fake_softmax),
                       ("attn_softmax_", _fake_softmax_), ("attn_softmax_segments", _fake_segments),
                       ("attn_softmax_segments_", _fake_segments_)):
        torch.library.register_fake(f"opgym::{name}", fake, lib=lib)
    for name in ("attn_windows", "attn_eager", "attn_softmax", "attn_softmax_segments"):
        m.refuses_grad(name, f"opgym::{name}{_NO_GRAD}")
    for name in ("attn_softmax_", "attn_softmax_segments_"):
        m.mutates(name, (0,), f"opgym::{name}{_NO_GRAD}")
    torch.ops.opgym_internal.set_torch_cpu_capability(torch.backends.cpu.get_cpu_capability())
