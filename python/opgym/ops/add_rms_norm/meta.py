"""opgym::add_rms_norm's operators, Python half (their CPU kernels: add_rms_norm.cpp, on torch's stable
ABI): schemas, fake kernels with the real kernels' checks, autograd rules (opgym/_meta.py)."""
from __future__ import annotations

import torch

from ... import _meta as m
from ..rms_norm import meta as rms_norm_meta


def define() -> None:
    m.define('add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, str mode="hf", '
             'bool weight_offset=False) -> (Tensor, Tensor)')
    # `norm_mode`, as rms_norm_'s: auto_functionalized's helper takes a parameter named `mode`. It
    # returns nothing, so torch.compile functionalizes it through auto_functionalized.
    m.define('add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps, str norm_mode="hf", '
             'bool weight_offset=False) -> ()')


def check(x, residual, weight, eps, mode, op) -> torch.dtype:
    """The CPU kernel's checks (add_rms_norm.cpp): the residual's, then RMSNorm's own; returns the normalized
    output's dtype."""
    m.check_tensor(x, "x", op)
    m.check_tensor(residual, "residual", op)
    if residual.dtype != x.dtype:
        raise ValueError(f"opgym::{op}: residual must have dtype {m.dtype_name(x.dtype)} (x's: HF adds the residual "
                         f"in the activations' dtype), got {m.dtype_name(residual.dtype)}")
    m.check_same_shape(residual, "residual", x, "x", op)
    m.check_device(residual, "residual", x, "x", op)
    return rms_norm_meta.check(x, weight, eps, mode, op)


def _fake(x, residual, weight, eps, mode="hf", weight_offset=False):
    out_dtype = check(x, residual, weight, eps, mode, "add_rms_norm")
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty(x.shape)


def _fake_inplace(x, residual, weight, eps, norm_mode="hf", weight_offset=False):
    out_dtype = check(x, residual, weight, eps, norm_mode, "add_rms_norm_")
    if out_dtype != x.dtype:
        raise ValueError(f"opgym::add_rms_norm_: in place needs an output dtype equal to x's {m.dtype_name(x.dtype)}, "
                         f"but the weight promotes it to {m.dtype_name(out_dtype)}; use opgym::add_rms_norm")


def register() -> None:
    torch.library.register_fake("opgym::add_rms_norm", _fake, lib=m.library("opgym"))
    torch.library.register_fake("opgym::add_rms_norm_", _fake_inplace, lib=m.library("opgym"))
    m.refuses_grad("add_rms_norm", "opgym::add_rms_norm has no backward (an inference kernel); call it under "
                   "torch.no_grad(), or use the layer's own code where gradients are needed (opgym.patch does so by "
                   "itself)")
    m.mutates("add_rms_norm_", (0, 1), "opgym::add_rms_norm_ has no autograd (an inference kernel); call it under "
              "torch.no_grad(), or use the layer's own code where gradients are needed")
