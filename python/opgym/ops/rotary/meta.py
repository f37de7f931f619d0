"""opgym::rotary's operators, Python half (their CPU kernels: rotary.cpp, on torch's stable ABI):
schemas, fake kernels with the real kernels' checks, autograd rules (opgym/_meta.py)."""
from __future__ import annotations

import torch

from ... import _meta as m


def define() -> None:
    m.define('rotary(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1, str mode="hf", '
             'int[]? mrope_section=None, str pairs="half", bool pair_table=False, bool contiguous=False) '
             '-> (Tensor, Tensor)')
    # `rotary_mode`: auto_functionalized's helper takes a parameter named `mode` (see rms_norm_).
    m.define('rotary_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, int unsqueeze_dim=1, '
             'str rotary_mode="hf", int[]? mrope_section=None, str pairs="half", bool pair_table=False) -> ()')


def check(q, k, cos, sin, mode, mrope_section, pairs, op) -> None:
    """The CPU kernel's checks (rotary.cpp)."""
    for t, name in ((q, "q"), (k, "k"), (cos, "cos"), (sin, "sin")):
        m.check_tensor(t, name, op)
    if mode not in ("hf", "fp32"):
        raise ValueError(f"opgym::{op}: mode must be 'hf' or 'fp32', got '{mode}'")
    if pairs not in ("half", "interleaved", "deinterleave"):
        raise ValueError(f"opgym::{op}: pairs must be 'half', 'interleaved' or 'deinterleave', got '{pairs}'")
    if k.dtype != q.dtype:
        raise ValueError(f"opgym::{op}: k must have q's dtype {m.dtype_name(q.dtype)}, got {m.dtype_name(k.dtype)}")
    if not (2 <= q.dim() <= 8 and k.dim() == q.dim()):
        raise ValueError(f"opgym::{op}: q and k must have one rank from 2 to 8, got {m.sizes(q)} and {m.sizes(k)}")
    if mode == "hf" and (cos.dtype != q.dtype or sin.dtype != q.dtype):
        raise ValueError(f"opgym::{op}: mode hf computes in q's dtype: cos and sin must be {m.dtype_name(q.dtype)}, "
                         f"got {m.dtype_name(cos.dtype)} and {m.dtype_name(sin.dtype)}")
    if mrope_section is not None and len(mrope_section) != 3:
        raise ValueError(f"opgym::{op}: mrope_section must hold three lengths, got {list(mrope_section)}")
    m.value_check(k.shape[-1] == q.shape[-1], f"opgym::{op}: k must have q's last dim {q.shape[-1]}, got {m.sizes(k)}")
    m.check_device(k, "k", q, "q", op)
    m.check_device(cos, "cos", q, "q", op)
    m.check_device(sin, "sin", q, "q", op)


def _output(x, contiguous):
    return x.new_empty(x.shape) if contiguous else torch.empty_like(x)


def _fake(q, k, cos, sin, unsqueeze_dim=1, mode="hf", mrope_section=None, pairs="half", pair_table=False,
          contiguous=False):
    check(q, k, cos, sin, mode, mrope_section, pairs, "rotary")
    return _output(q, contiguous), _output(k, contiguous)


def _fake_inplace(q, k, cos, sin, unsqueeze_dim=1, rotary_mode="hf", mrope_section=None, pairs="half",
                  pair_table=False):
    check(q, k, cos, sin, rotary_mode, mrope_section, pairs, "rotary_")


def register() -> None:
    torch.library.register_fake("opgym::rotary", _fake, lib=m.library("opgym"))
    torch.library.register_fake("opgym::rotary_", _fake_inplace, lib=m.library("opgym"))
    m.refuses_grad("rotary", "opgym::rotary has no backward (an inference kernel); call it under torch.no_grad(), "
                   "or use HF's own function where gradients are needed (opgym.patch does so by itself)")
    m.mutates("rotary_", (0, 1), "opgym::rotary_ has no autograd (an inference kernel); call it under torch.no_grad()")
